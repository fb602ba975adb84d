"""The Tinker-compatible service as its users meet it: a real server process on a loopback
port, driven by the official ``tinker`` SDK, unchanged. A LoRA model learns through
``forward_backward`` and ``optim_step``; two owners train at once, each on its solo curve and
blind to the other; a retried call is applied once; a call without a known key is refused."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker.proto import request_conv, response_conv

from tests.helpers import self_signed_cert
from tests.tinker_service import BASE, running

KEYS = {"alice": "tml-alice-key", "bob": "tml-bob-key"}


def _running(folder: Path) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[str]]]:
    return running(folder, KEYS)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _running(tmp_path_factory.mktemp("tinker")) as (url, _):
        yield url


@pytest.fixture(autouse=True)
def _sdk_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _batch(seed: int) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for n in (7, 11, 5):
        tokens = rng.integers(0, 200, n + 1).tolist()
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n},
            )
        )
    return data


def _train(url: str, owner: str, seed: int, steps: int) -> list[float]:
    """A user's own loop: the same batch each step; the loss of each step."""
    with tinker.ServiceClient(base_url=url, api_key=KEYS[owner]) as service:
        client = service.create_lora_training_client(base_model=BASE, rank=8, seed=seed).result()
        losses = []
        batch = _batch(seed)
        for _ in range(steps):
            fwdbwd = client.forward_backward(batch, "cross_entropy")
            optim = client.optim_step(types.AdamParams(learning_rate=2e-2))
            out = fwdbwd.result()
            optim.result()
            assert [len(o["logprobs"].tolist()) for o in out.loss_fn_outputs] == [7, 11, 5]
            losses.append(out.metrics["loss:sum"])
    return losses  # the session finished: its tenant left the learner


def test_the_sdk_trains_a_lora_model_and_its_loss_falls(server: str) -> None:
    service = tinker.ServiceClient(base_url=server, api_key=KEYS["alice"])
    client = service.create_lora_training_client(base_model=BASE, rank=4).result()
    info = client.get_info()
    assert (info.model_data.model_name, info.lora_rank, info.is_lora) == (BASE, 4, True)
    assert Path(info.model_data.tokenizer_id or "").is_dir()  # local: nothing downloaded
    losses = _train(server, "alice", seed=3, steps=6)
    assert losses[-1] < 0.5 * losses[0], losses


def test_two_owners_train_at_once_each_on_its_solo_curve(server: str) -> None:
    solo = {owner: _train(server, owner, seed, 4) for owner, seed in (("alice", 5), ("bob", 6))}
    together: dict[str, list[float]] = {}

    def run(owner: str, seed: int) -> None:
        together[owner] = _train(server, owner, seed, 4)

    threads = [threading.Thread(target=run, args=a) for a in (("alice", 5), ("bob", 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert set(together) == {"alice", "bob"}
    for owner in solo:
        np.testing.assert_allclose(together[owner], solo[owner], rtol=1e-5)


def test_a_saved_state_resumes_where_it_was_saved(server: str) -> None:
    service = tinker.ServiceClient(base_url=server, api_key=KEYS["bob"])
    first = service.create_lora_training_client(base_model=BASE, rank=4, seed=9).result()
    batch = _batch(9)
    adam = types.AdamParams(learning_rate=2e-2)

    def step(client: tinker.TrainingClient) -> float:
        out = client.forward_backward(batch, "cross_entropy").result()
        client.optim_step(adam).result()
        return float(out.metrics["loss:sum"])

    step(first)
    step(first)
    path = first.save_state("two-steps").result().path
    assert path.endswith("/weights/two-steps")
    sampler = first.save_weights_for_sampler("adapter-only").result().path
    assert sampler.endswith("/sampler_weights/adapter-only")
    third = step(first)
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.get_info().lora_rank == 4
    assert step(resumed) == pytest.approx(third, rel=1e-6)  # the AdamW moments came back too
    weights_only = service.create_training_client_from_state(sampler).result()
    # the adapter as it was, a fresh optimizer: the same loss, a different step after it
    out = weights_only.forward_backward(batch, "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(third, rel=1e-6)
    alice = tinker.ServiceClient(base_url=server, api_key=KEYS["alice"])
    with pytest.raises(tinker.NotFoundError):  # another owner's checkpoint is unknown to alice
        alice.create_training_client_from_state(path).result()


def _post(url: str, path: str, key: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/{path}", json=body, headers={"X-API-Key": key, **headers})


def _future(url: str, key: str, request_id: str) -> httpx.Response:
    while True:
        reply = _post(url, "retrieve_future", key, {"request_id": request_id})
        if reply.status_code != 200 or reply.headers["content-type"].startswith(
            "application/x-protobuf"
        ):
            return reply
        if reply.json().get("type") != "try_again":
            return reply


def _model(url: str, key: str) -> str:
    session = _post(url, "create_session", key, {"tags": [], "sdk_version": "test"}).json()
    created = _post(
        url,
        "create_model",
        key,
        {
            "session_id": session["session_id"],
            "model_seq_id": 0,
            "base_model": BASE,
            "lora_config": {"rank": 4},
        },
    ).json()
    return str(_future(url, key, created["request_id"]).json()["model_id"])


def _fwdbwd_body(model_id: str, seq_id: int) -> bytes:
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=_batch(0), loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id,
    )
    return request_conv.forward_backward_request_to_proto(request).SerializeToString()


def test_a_retried_optim_step_is_applied_once(server: str) -> None:
    key = KEYS["alice"]
    model_id = _model(server, key)
    fwdbwd = httpx.post(
        f"{server}/api/v1/forward_backward",
        content=_fwdbwd_body(model_id, 1),
        headers={"X-API-Key": key, "Content-Type": "application/x-protobuf"},
    ).json()["request_id"]
    assert _future(server, key, fwdbwd).status_code == 200
    step = {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 1e-3}}
    first = _post(server, "optim_step", key, step, **{"X-Idempotency-Key": str(uuid.uuid4())})
    again = _post(server, "optim_step", key, step, **{"X-Idempotency-Key": str(uuid.uuid4())})
    assert first.json()["request_id"] == again.json()["request_id"]
    assert _future(server, key, first.json()["request_id"]).json()["metrics"]["step:max"] == 1
    step["seq_id"] = 3
    later = _post(server, "optim_step", key, step).json()["request_id"]
    assert _future(server, key, later).json()["metrics"]["step:max"] == 2  # not 3


def test_an_owner_cannot_reach_another_owners_model_or_futures(server: str) -> None:
    model_id = _model(server, KEYS["alice"])
    bob = KEYS["bob"]
    info = _post(server, "get_info", bob, {"model_id": model_id})
    assert info.status_code == 404 and model_id in info.json()["error"]
    step = {"model_id": model_id, "seq_id": 1, "adam_params": {}}
    assert _post(server, "optim_step", bob, step).status_code == 404
    alices = _post(server, "optim_step", KEYS["alice"], step).json()["request_id"]
    assert _post(server, "retrieve_future", bob, {"request_id": alices}).status_code == 404


def test_calls_without_a_known_key_are_refused_and_the_handshake_is_open(server: str) -> None:
    assert _post(server, "create_session", "tml-wrong", {}).status_code == 401
    assert httpx.post(f"{server}/api/v1/create_session", json={}).status_code == 401
    config = httpx.post(f"{server}/api/v1/client/config", json={"sdk_version": "0.38.0"})
    assert config.status_code == 200 and config.json()["use_pyqwest_transport"] is False
    unknown = _post(server, "save_weights", KEYS["alice"], {"model_id": "x", "seq_id": 1})
    assert unknown.status_code == 404 and "no model 'x'" in unknown.json()["error"]


def test_a_killed_service_restarts_with_every_acknowledged_step_and_none_twice(
    tmp_path: Path,
) -> None:
    key = KEYS["alice"]

    def fwdbwd(url: str, model_id: str, seq: int) -> httpx.Response:
        return httpx.post(
            f"{url}/api/v1/forward_backward",
            content=_fwdbwd_body(model_id, seq),
            headers={"X-API-Key": key, "Content-Type": "application/x-protobuf"},
        )

    def optim(url: str, model_id: str, seq: int) -> httpx.Response:
        step = {"model_id": model_id, "seq_id": seq, "adam_params": {"learning_rate": 2e-2}}
        return _post(url, "optim_step", key, step)

    def loss(url: str, request_id: str) -> float:
        body = _future(url, key, request_id).content
        return float(response_conv.deserialize_forward_backward_output(body).metrics["loss:sum"])

    with _running(tmp_path) as (url, proc):
        model_id = _model(url, key)
        reference = _model(url, key)  # the same seed, never interrupted
        for mid in (model_id, reference):
            for seq in (1, 3):
                loss(url, fwdbwd(url, mid, seq).json()["request_id"])
                _future(url, key, optim(url, mid, seq + 1).json()["request_id"])
        last_step = optim(url, model_id, 4).json()["request_id"]  # a retry of an answered call
        pending = fwdbwd(url, model_id, 5).json()["request_id"]
        loss(url, pending)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    with _running(tmp_path) as (url, _):
        assert _future(url, key, last_step).json()["metrics"]["step:max"] == 2  # kept
        assert optim(url, model_id, 4).json()["request_id"] == last_step  # not run again
        step = _future(url, key, optim(url, model_id, 6).json()["request_id"]).json()
        assert step["metrics"]["step:max"] == 3  # the lost gradients of seq 5 came back
        loss(url, fwdbwd(url, reference, 5).json()["request_id"])
        _future(url, key, optim(url, reference, 6).json()["request_id"])
        after = loss(url, fwdbwd(url, model_id, 7).json()["request_id"])
        assert after == pytest.approx(loss(url, fwdbwd(url, reference, 7).json()["request_id"]))


def test_an_rl_loop_samples_its_own_adapter_and_learns(server: str) -> None:
    """The cookbook's RL shape, by hand: sample a group from the current adapter, reward,
    importance-sampling step. The reward: the first token is not the base model's favourite."""
    prompt = [16, 17, 10, 18, 19, 28]  # "12+34=": the favourite first token has p = 0.69
    with tinker.ServiceClient(base_url=server, api_key=KEYS["alice"]) as service:
        client = service.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()
        base = service.create_sampling_client(base_model=BASE).result()
        params = types.SamplingParams(max_tokens=1, temperature=0.0)
        favourite = base.sample(types.ModelInput.from_ints(prompt), 1, params).result()
        avoid = favourite.sequences[0].tokens[0]
        rates = []
        for step in range(8):
            sampler = client.save_weights_and_get_sampling_client().result()
            group = sampler.sample(
                types.ModelInput.from_ints(prompt),
                num_samples=16,
                sampling_params=types.SamplingParams(max_tokens=1, seed=100 + step),
            ).result()
            rewards = np.array([float(s.tokens[0] != avoid) for s in group.sequences])
            rates.append(rewards.mean())
            data = [
                types.Datum(
                    model_input=types.ModelInput.from_ints(prompt),
                    loss_fn_inputs={
                        "target_tokens": [*prompt[1:], s.tokens[0]],
                        "logprobs": [0.0] * 5 + [s.logprobs[0]],
                        "advantages": [0.0] * 5 + [float(r - rewards.mean())],
                    },
                )
                for s, r in zip(group.sequences, rewards, strict=True)
            ]
            out = client.forward_backward(data, "importance_sampling").result()
            # on-policy: the learner's log-prob of each sampled token is the sampler's
            for s, o in zip(group.sequences, out.loss_fn_outputs, strict=True):
                assert o["logprobs"].tolist()[-1] == pytest.approx(s.logprobs[0], abs=1e-4)
            client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    print("reward rate per step:", rates)
    assert rates[0] < 0.6 and np.mean(rates[-2:]) > 0.9, rates


def test_cispo_and_dro_through_the_sdk_are_their_formulas_and_a_bad_config_is_refused(
    server: str,
) -> None:
    """``cispo`` and ``dro`` on the wire: each call's ``loss:sum`` is its formula over the
    log-probs the same call returns; ``dro`` without ``beta`` fails the call by name."""
    rng = np.random.default_rng(3)
    data, sampled, advantages = [], [], []
    for datum in _batch(5):
        n = len(datum.loss_fn_inputs["target_tokens"].tolist())
        sampled.append(rng.uniform(-6, -1, n))
        advantages.append(rng.normal(size=n))
        data.append(
            types.Datum(
                model_input=datum.model_input,
                loss_fn_inputs={
                    "target_tokens": datum.loss_fn_inputs["target_tokens"],
                    "logprobs": sampled[-1].tolist(),
                    "advantages": advantages[-1].tolist(),
                },
            )
        )
    with tinker.ServiceClient(base_url=server, api_key=KEYS["bob"]) as service:
        client = service.create_lora_training_client(base_model=BASE, rank=4).result()
        cispo = client.forward_backward(data, "cispo").result()
        dro = client.forward_backward(data, "dro", {"beta": 0.1}).result()
        with pytest.raises(tinker.TinkerError, match="dro needs loss_fn_config\\['beta'\\]"):
            client.forward_backward(data, "dro").result()
    expected_cispo = expected_dro = 0.0
    for out, q, a in zip(cispo.loss_fn_outputs, sampled, advantages, strict=True):
        p = np.asarray(out["logprobs"].tolist(), dtype=np.float64)
        expected_cispo -= float((np.clip(np.exp(p - q), 0.0, 4.0) * p * a).sum())
        expected_dro -= float((p * a - 0.05 * (p - q) ** 2).sum())
    assert cispo.metrics["loss:sum"] == pytest.approx(expected_cispo, rel=1e-4)
    assert dro.metrics["loss:sum"] == pytest.approx(expected_dro, rel=1e-4)


def test_a_custom_loss_runs_through_forward_and_weighted_cross_entropy(server: str) -> None:
    """The SDK's ``forward_backward_custom`` (a ``forward``, the user's loss on the client,
    then ``cross_entropy`` with its gradient as weights): with the loss ``-sum(logprobs)`` it
    steps exactly as ``cross_entropy`` with weights 1 does."""
    import torch

    batch = _batch(12)
    adam = types.AdamParams(learning_rate=2e-2)
    with tinker.ServiceClient(base_url=server, api_key=KEYS["alice"]) as service:
        custom = service.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
        plain = service.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()

        def loss_fn(
            data: list[types.Datum], logprobs: list[torch.Tensor]
        ) -> tuple[torch.Tensor, dict[str, float]]:
            loss = -sum(lp.sum() for lp in logprobs)
            return loss, {"custom:sum": float(loss.detach())}

        out = custom.forward_backward_custom(batch, loss_fn).result()
        custom.optim_step(adam).result()
        plain.forward_backward(batch, "cross_entropy").result()
        plain.optim_step(adam).result()
        after = [
            c.forward(batch, "cross_entropy").result().metrics["loss:sum"] for c in (custom, plain)
        ]
    assert out.metrics["custom:sum"] > 0
    assert after[0] == pytest.approx(after[1], rel=1e-5)


def test_tls_off_loopback_rule_and_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed_cert(tmp_path)
    refused = subprocess.run(
        [sys.executable, "-m", "hybridflow.services.tinker", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HYBRIDFLOW_TOKEN": "t"},
    )
    assert refused.returncode != 0 and "off loopback" in refused.stderr
    with running(tmp_path, KEYS, "--tls-cert", str(cert), "--tls-key", str(key)) as (url, _):
        assert url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(cert))
        assert httpx.get(f"{url}/api/v1/healthz", verify=trusted).json() == {"status": "ok"}
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        with tinker.ServiceClient(base_url=url, api_key=KEYS["alice"]) as service:
            client = service.create_lora_training_client(base_model=BASE, rank=4).result()
            assert client.get_info().lora_rank == 4


def test_checkpoints_are_listed_deleted_and_outlive_their_session(server: str) -> None:
    """What the cookbook does around checkpoints: list them, read the run's metadata, resume
    from one after its session ended, and delete one (rolling checkpoints)."""
    with tinker.ServiceClient(base_url=server, api_key=KEYS["bob"]) as service:
        client = service.create_lora_training_client(
            base_model=BASE, rank=4, user_metadata={"renderer_name": "qwen3"}
        ).result()
        model_id = client.model_id
        first = client.forward_backward(_batch(1), "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        state = client.save_state("s1").result().path
        client.save_weights_for_sampler("w1").result()
        rest = tinker.RestClient(base_url=server, api_key=KEYS["bob"])
        run = rest.get_training_run(model_id).result()
        assert (run.user_metadata, run.lora_rank) == ({"renderer_name": "qwen3"}, 4)
        listed = rest.list_checkpoints(model_id).result().checkpoints
        assert sorted(c.checkpoint_id for c in listed) == ["sampler_weights/w1", "weights/s1"]
        assert {c.checkpoint_type for c in listed} == {"training", "sampler"}
    assert first.metrics["loss:sum"] > 0
    with tinker.ServiceClient(base_url=server, api_key=KEYS["bob"]) as later:  # a new session
        resumed = later.create_training_client_from_state_with_optimizer(state).result()
        assert resumed.get_info().lora_rank == 4
        rest = tinker.RestClient(base_url=server, api_key=KEYS["bob"])
        rest.delete_checkpoint(model_id, "sampler_weights/w1").result()
        listed = rest.list_checkpoints(model_id).result().checkpoints
        assert [c.checkpoint_id for c in listed] == ["weights/s1"]
    other = tinker.RestClient(base_url=server, api_key=KEYS["alice"])
    with pytest.raises(tinker.NotFoundError):
        other.list_checkpoints(model_id).result()
