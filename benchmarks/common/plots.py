"""PNG plots of a suite's runs: reward over steps, throughput over time, phase timelines."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common.figures import read_jsonl, read_steps

_COLORS = {"generate": "tab:blue", "score": "tab:green", "train": "tab:orange", "sync": "tab:red"}


def plot_all(out: Path, names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_t) = plt.subplots(1, 2, figsize=(12, 4))
    for name in names:
        rows = read_steps(out / name / "metrics.jsonl")
        if not rows:
            continue
        t0 = rows[0]["time"] - rows[0]["timing_s/step"]
        ax_r.plot([r["step"] for r in rows], [r["critic/score/mean"] for r in rows], label=name)
        ax_t.plot(
            [r["time"] - t0 for r in rows], [r["perf/samples_per_s"] for r in rows], label=name
        )
    ax_r.set(xlabel="step", ylabel="mean reward", title="reward over steps")
    ax_t.set(xlabel="wall time (s)", ylabel="samples/s (per step)", title="throughput over time")
    ax_r.legend()
    ax_t.legend()
    fig.tight_layout()
    fig.savefig(out / "reward_throughput.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(len(names), 1, figsize=(12, 1.6 + 1.4 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        events = read_jsonl(out / name / "events.jsonl")
        if not events:
            continue
        t0 = min(e["start"] for e in events)
        lanes = sorted({_lane(e) for e in events})
        for e in events:
            ax.barh(
                lanes.index(_lane(e)),
                e["duration_s"],
                left=e["start"] - t0,
                color=_COLORS.get(e["kind"], "gray"),
                height=0.8,
            )
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_title(
            f"{name}: phases per service (blue generate, green score, orange train, red sync)"
        )
        ax.set_xlabel("wall time (s)")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=100)
    plt.close(fig)


def _lane(event: dict) -> str:
    if event["kind"] in ("generate", "score"):
        return f"rollout{event.get('replica', 0)}"
    return "learner"
