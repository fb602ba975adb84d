"""Hub model ids resolve through a Hugging Face cache the test builds itself; no network:
every test runs with HF_HUB_OFFLINE=1 or with the download replaced by a failure."""

from pathlib import Path

import pytest

from hybridflow.deploy.preflight import problems
from hybridflow.models import resolve_model_path
from hybridflow.models.hub import HubId, parse_hub_id

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "deploy" / "configs" / "quickstart.yaml"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache: Path, repo_id: str, revision: str = "main") -> Path:
    """Lays out the hub cache's entry for ``repo_id`` as huggingface_hub does: a ref naming a
    commit, and the commit's snapshot directory."""
    entry = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = entry / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    (entry / "refs").mkdir()
    (entry / "refs" / revision).write_text(COMMIT)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hub_ids_are_org_slash_name_and_not_local_paths(tmp_path, monkeypatch):
    assert parse_hub_id("Qwen/Qwen2.5-0.5B") == HubId("Qwen/Qwen2.5-0.5B", None)
    assert parse_hub_id("org/name@v1.0") == HubId("org/name", "v1.0")
    assert parse_hub_id("builtin:tiny") is None
    assert parse_hub_id("/abs/path/model") is None
    assert parse_hub_id("just-a-name") is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "local").mkdir(parents=True)
    assert parse_hub_id("org/local") is None  # an existing directory stays a local path


def test_a_cached_hub_model_resolves_offline(hub_cache):
    snapshot = cache_model(hub_cache, "org/name")
    assert resolve_model_path("org/name") == snapshot
    assert resolve_model_path("org/name@main") == snapshot


def test_a_revision_resolves_through_its_ref(hub_cache):
    snapshot = cache_model(hub_cache, "org/name", revision="v2")
    assert resolve_model_path("org/name@v2") == snapshot
    with pytest.raises(ValueError, match="'org/name'"):
        resolve_model_path("org/name")  # no refs/main in this cache


def test_an_uncached_hub_model_offline_is_one_line_naming_the_id(hub_cache):
    with pytest.raises(ValueError) as info:
        resolve_model_path("org/missing")
    message = str(info.value)
    assert "\n" not in message
    assert "'org/missing'" in message
    assert "HF_HUB_OFFLINE is set" in message and str(hub_cache) in message


def test_a_failed_download_falls_back_to_the_cache(hub_cache, monkeypatch):
    import huggingface_hub

    real = huggingface_hub.snapshot_download

    def no_network(repo_id, **kwargs):  # type: ignore[no-untyped-def]
        if not kwargs.get("local_files_only"):
            raise OSError("network is unreachable")
        return real(repo_id, **kwargs)

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    snapshot = cache_model(hub_cache, "org/name")
    assert resolve_model_path("org/name") == snapshot
    with pytest.raises(ValueError) as info:
        resolve_model_path("org/missing")
    assert "'org/missing': not downloaded (OSError: network is unreachable)" in str(info.value)


def test_preflight_accepts_a_cached_hub_model_and_refuses_an_uncached_one_offline(hub_cache):
    cache_model(hub_cache, "org/name")
    assert problems(QUICKSTART, ["model=org/name"]) == []
    assert problems(QUICKSTART, ["model=org/missing"]) == [
        "config error: model: hub model 'org/missing' is not in the Hugging Face cache "
        "and HF_HUB_OFFLINE is set"
    ]
