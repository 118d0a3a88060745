"""`gpujob profiles` shows each venv's real disk use; `gpujob gc` removes venvs not
used for N days, never the active or a known-good one. Real venvs built by uv on
the local target."""

from __future__ import annotations

from gpujob.agent.home import gc
from gpujob.ops.wheelhouse import build_indexes
from helpers import cli, cli_json, local_env, write_spec


def test_select_keeps_active_and_known_good():
    envs = [{"env_key": k, "profile": k.split("-")[0], "last_used": 0.0}
            for k in ("a-1", "b-1", "c-1", "d-1")]
    got = {e["env_key"]: why for e, why in gc.select(envs, 1, 10 * 86400, {"a-1"}, {"b-1"}, {"c"})}
    assert got == {"a-1": "active: a running job uses it", "b-1": "known-good", "c-1": "known-good",
                   "d-1": "remove"}
    assert gc.select(envs[3:], 30, 10 * 86400, set(), set(), set())[0][1] == "used 10.0 days ago"


def test_gc_removes_only_the_unused_bad_venv(tmp_path):
    idx = {b: p.as_uri() for b, p in build_indexes(tmp_path / "wh").items()}
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=idx["fast"], slow_url=idx["slow"],
                      warmup=False, trainer_args="--steps 24 --interval 0.05")
    assert cli(["submit", str(spec), "--profile", "fast", "--follow"], env, timeout=120).returncode == 0
    assert cli(["submit", str(spec), "--follow"], env, timeout=120).returncode == 0  # slow -> fast
    prof = cli_json(["profiles", "box", "--json"], env)
    for e in prof["envs"]:
        d = e["disk"]
        assert d["apparent"] > 0 and 0 <= d["own"] <= d["real"]
    assert prof["disk_total"]["real"] <= sum(e["disk"]["real"] for e in prof["envs"])
    dry = cli_json(["gc", "box", "--days", "0", "--dry-run", "--json"], env)
    assert {e["profile"]: e["why"] for e in dry["envs"]} == {"fast": "known-good", "slow": "remove"}
    assert len(list((tmp_path / "root" / "envs").iterdir())) == 2  # a dry run removes nothing
    kept = cli_json(["gc", "box", "--days", "1", "--json"], env)
    assert [e["why"] for e in kept["envs"] if e["profile"] == "slow"] == ["used 0.0 days ago"]
    out = cli(["gc", "box", "--days", "0"], env, check=True).stdout.decode()
    assert "removed" in out and "kept: known-good" in out
    assert [p.name.split("-")[0] for p in (tmp_path / "root" / "envs").iterdir()] == ["fast"]
    assert cli(["gc", "box", "--days", "-1"], env).returncode == 2
