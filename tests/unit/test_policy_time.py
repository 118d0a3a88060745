"""Issue 22, items 1-2: windows and limits in time, delays from the first sample, the
settle rule, pauses (checkpoint saves, pause_pattern) left out of windows."""

from gpujob.agent.judge.pauses import Clock, Pauses
from gpujob.agent.judge.policy import PolicyConfig, Sample, decide, known_good

REAL = dict(min_ratio=0.8, window="30s", failure_limit="2m", min_samples=3)  # docs/rollback.md's advice


def run(cfg, samples, baseline, pauses=None, phase_start=None):
    """Decide after every sample, as the supervisor does; the verdicts in order."""
    out, memo = [], {}
    start = samples[0].t if phase_start is None else phase_start
    for i in range(len(samples)):
        spans = pauses.spans() if pauses is not None else ()
        out.append(decide(cfg, samples[:i + 1], samples[i].t, start, baseline, spans, memo))
    return out


def series(values, hz=10.0, t0=1000.0):
    return [Sample(t0 + i / hz, float(v), i) for i, v in enumerate(values)]


def test_hf_save_dip_with_a_checkpoint_event_is_a_pause_not_a_breach():
    # 811K steady at 10 Hz, a save: 360K for ~1 s, back to 802K; window of 10 samples, limit 3
    vals = [811e3] * 100 + [360e3] * 10 + [802e3] * 50
    s = series(vals)
    cfg = PolicyConfig(min_ratio=0.8, window=10, failure_limit=3)
    p = Pauses(tail=5.0)
    verdicts = []
    memo = {}
    for i, smp in enumerate(s):
        if i == 100:  # the watcher sees the checkpoint directory appear (up to a poll late)
            p.on_ckpt_events([{"t": smp.t + 0.5, "ckpt": "out/checkpoint-100", "op": "new", "size": 10}])
        verdicts.append(decide(cfg, s[:i + 1], smp.t, s[0].t, 811e3, p.spans(), memo).verdict)
    assert "rollback" not in verdicts and "breach" not in verdicts
    assert "paused" in verdicts and verdicts[-1] == "ok"
    # today's rule (no pause information) breaches and rolls back inside the dip
    assert "rollback" in [d.verdict for d in run(PolicyConfig(min_ratio=0.8, window=10, failure_limit=3,
                                                                settle_samples=0), s, 811e3)]


def test_resumed_running_average_climb_is_settling_not_a_breach():
    # a resumed HF bar: ~10 s of start-up, then its running average climbs 16.8 -> 55 it/s in 15 redraws
    climb = [16.8 + (55 - 16.8) * (1 - 0.75 ** k) for k in range(15)]
    s = [Sample(1010.0 + 0.5 * k, v * 1000) for k, v in enumerate(climb + [55.0] * 40)]
    cfg = PolicyConfig(min_ratio=0.8, window=5, failure_limit=3, initial_delay=0)
    verdicts = [d.verdict for d in run(cfg, s, 55e3, phase_start=1000.0)]
    assert "breach" not in verdicts and "rollback" not in verdicts
    assert verdicts[0] == "settling" and verdicts[-1] == "ok"
    # without the settle rule the climb is judged: a rollback of a good profile
    old = PolicyConfig(min_ratio=0.8, window=5, failure_limit=3, settle_samples=0)
    assert "rollback" in [d.verdict for d in run(old, s, 55e3, phase_start=1000.0)]


def test_initial_delay_counts_from_the_first_sample():
    cfg = PolicyConfig(min=10.0, window=3, failure_limit=1, initial_delay=20, settle_samples=0)
    s = [Sample(100.0 + k, 50.0) for k in range(30)]  # first sample 100 s after the phase start
    assert decide(cfg, s[:15], s[14].t, 0.0, None).verdict == "warming_up"  # 14 s after the first sample
    assert decide(cfg, s, s[-1].t, 0.0, None).verdict == "ok"


def test_true_slowdown_caught_with_its_detection_time():
    s = series([800e3] * 600 + [300e3] * 3000, hz=10)  # 60 s good, then 3x slower
    cfg = PolicyConfig(**REAL)
    memo, t_roll = {}, None
    for i in range(len(s)):
        d = decide(cfg, s[:i + 1], s[i].t, s[0].t, 800e3, (), memo)
        if d.verdict == "rollback":
            t_roll = s[i].t
            break
    slow_start = s[600].t
    assert t_roll is not None
    took = t_roll - slow_start
    # half a window for the median to flip, then the breach weighed (agent/judge/tail.py): at 300K
    # under a 640K threshold each second counts (ln(640/300) / ln(1/0.75))^2 = 6.9 seconds of the 2m limit
    assert 28 <= took <= 36, took
    assert "breaching for 1" in d.reason  # 17-18 s of the limit's 120 s sufficed


def test_time_window_with_too_few_samples_is_inconclusive():
    cfg = PolicyConfig(min=10.0, window="60s", failure_limit=1, min_samples=3, settle_samples=0)
    s = [Sample(50.0 * k, 5.0) for k in range(4)]  # one line every 50 s: 2 in a 60 s window
    d = decide(cfg, s, s[-1].t, 0.0, None)
    assert d.verdict == "inconclusive" and "min_samples" in d.reason
    ok = PolicyConfig(min=10.0, window="120s", failure_limit=1, min_samples=3, settle_samples=0)
    assert decide(ok, s, s[-1].t, 0.0, None).verdict == "rollback"


def test_failure_limit_in_time_and_pauses_do_not_count():
    cfg = PolicyConfig(min=10.0, window="10s", failure_limit="30s", settle_samples=0)
    # a shallow breach (8 under 10: shallower than 75 % of the threshold) must hold the whole limit
    s = [Sample(float(k), 20.0) for k in range(20)] + [Sample(float(k), 8.0) for k in range(20, 80)]
    verdicts = {d.verdict for d in run(cfg, s[:50], None)}
    # 30 s of low samples: the median flips at ~25 s: not 30 s of breach
    assert "rollback" not in verdicts and "breach" in verdicts
    assert run(cfg, s, None)[-1].verdict == "rollback"
    # the same stretch with a 30 s pause inside: pause time is no breach time
    p = Pauses(tail=0.0, lead=0.0)
    p.mark(40.0, "eval")
    p.intervals[-1][1] = 70.0
    assert decide(cfg, s[:75], 74.0, 0.0, None, p.spans()).verdict == "breach"


def test_a_deep_breach_is_decided_sooner_than_a_shallow_one():
    # the evidence of a breach is weighed (agent/judge/tail.py): a drop to half the threshold
    # counts (ln 2 / ln(1/0.75))^2 = 5.8 seconds of the limit for each second it lasts
    cfg = PolicyConfig(min=10.0, window="10s", failure_limit="30s", settle_samples=0)
    deep = [Sample(float(k), 20.0) for k in range(20)] + [Sample(float(k), 5.0) for k in range(20, 80)]
    verdicts = [d.verdict for d in run(cfg, deep, None)]
    first = verdicts.index("rollback")
    assert 28 <= deep[first].t <= 33  # the median flips at ~25 s, then 5.2 s weigh the 30 s limit


def test_paused_verdict_and_no_stall_during_a_pause():
    cfg = PolicyConfig(min=10.0, window=3, failure_limit=1, no_data_timeout=30, settle_samples=0)
    s = [Sample(float(k), 20.0) for k in range(10)]
    p = Pauses(tail=5.0)
    p.mark(10.0, "eval")
    assert decide(cfg, s, 12.0, 0.0, None, p.spans()).verdict == "paused"
    for t in range(11, 300, 3):
        p.mark(float(t), "eval")  # a long eval prints progress lines matching pause_pattern
    assert decide(cfg, s, 300.0, 0.0, None, p.spans()).verdict == "paused"
    assert decide(cfg, s, 320.0, 0.0, None, p.spans()).verdict == "ok"  # 15 s after it: no stall
    assert decide(cfg, s, 340.0, 0.0, None, p.spans()).verdict == "stall"


def test_clock_active_time():
    c = Clock([(10.0, 20.0), (30.0, 35.0)])
    assert (c.tau(5), c.tau(15), c.tau(25), c.tau(40)) == (5, 10, 15, 25)
    assert c.paused(12) == (10.0, 20.0) and c.paused(20) is None


def test_known_good_leaves_pauses_out():
    cfg = PolicyConfig(min=10.0, window=3, failure_limit=1, good_after=20, settle_samples=0)
    s = [Sample(float(k), 20.0 if not 10 <= k < 15 else 1.0) for k in range(40)]
    assert known_good(cfg, s, 39.0, 0.0, None) is None  # the dip breaches a window
    p = Pauses(tail=0.0, lead=0.0)
    p.mark(9.5, "checkpoint")
    p.intervals[-1][1] = 15.5
    assert known_good(cfg, s, 39.0, 0.0, None, p.spans()) == 20.0
    assert known_good(cfg, s[:25], 24.0, 0.0, None, p.spans()) is None  # 24 s wall, 18 s active


def test_settle_timeout_judges_a_noisy_rate():
    cfg = PolicyConfig(min=100.0, window=3, failure_limit=2, settle_timeout=30)
    s = [Sample(float(k), 10.0 if k % 2 else 30.0) for k in range(60)]  # never within 10%
    verdicts = [d.verdict for d in run(cfg, s, None)]
    assert verdicts[20] == "settling" and verdicts[-1] == "rollback"


def test_saves_as_often_as_a_pause_lasts_stop_pausing_the_run():
    """A trainer whose saves come closer together than a pause lasts (whatever
    train.checkpoint.every says) would be paused for good: from the second such save on,
    saves are its pace; the files of one save (HF's checkpoint-N/*) are one save."""
    from gpujob.agent.judge.pauses import Pauses, save_key
    assert save_key("hf_out/checkpoint-1133/model.safetensors") == "checkpoint-1133"
    assert save_key("outputs/tiny-step4/training_state.pt") == "tiny-step4"
    assert save_key("out/ckpt.pt") == "out/ckpt.pt"
    p = Pauses(5.0)
    files = ("model.safetensors", "optimizer.pt", "trainer_state.json")
    p.on_ckpt_events([{"t": 100.0 + 0.2 * i, "ckpt": f"o/checkpoint-10/{f}", "op": "new", "size": 1}
                      for i, f in enumerate(files)])
    p.on_ckpt_events([{"t": 130.0, "ckpt": "o/checkpoint-20/model.safetensors", "op": "new", "size": 1}])
    assert p.ckpt and p.count == 2 and p.rhythm is None  # one pause per save, 30 s apart
    q = Pauses(5.0)
    q.on_ckpt_events([{"t": 10.0, "ckpt": "outputs/tiny-step2/training_state.pt", "op": "new", "size": 1}])
    q.on_ckpt_events([{"t": 10.4, "ckpt": "outputs/tiny-step4/training_state.pt", "op": "new", "size": 1}])
    assert not q.ckpt and "saves are this trainer's pace" in q.rhythm
    assert q.active_at(11.0) is None  # the pause in progress ended at the second save
    q.on_ckpt_events([{"t": 20.0, "ckpt": "outputs/tiny-step6/training_state.pt", "op": "new", "size": 1}])
    assert q.count == 1 and q.active_at(20.5) is None


def test_lightning_saves_and_rewrites_in_place_are_told_apart_from_one_long_save():
    """Lightning names a save by its step under a numbered version_N/ (the step names the
    save, not the version); a file rewritten in place (nanoGPT's out/ckpt.pt, last.ckpt)
    is saved anew when it changes after a quiet spell; one long write stays one save."""
    from gpujob.agent.judge.pauses import QUIET, Pauses, save_key
    ck = "lightning_logs/version_0/checkpoints"
    assert save_key(f"{ck}/epoch=0-step=12.ckpt") == "epoch=0-step=12.ckpt"
    assert (save_key("run_3/w.pt") == "run_3"
            and save_key("out/step_7/model-00001-of-00002.safetensors") == "step_7")
    lt = Pauses(5.0)  # every_n_train_steps: a new file each save, the previous one deleted (save_top_k=1)
    lt.on_ckpt_events([{"t": 10.0, "ckpt": f"{ck}/epoch=0-step=2.ckpt", "op": "new", "size": 1}])
    assert lt.ckpt and lt.count == 1
    lt.on_ckpt_events([{"t": 15.0, "ckpt": f"{ck}/epoch=0-step=12.ckpt", "op": "new", "size": 1},
                       {"t": 15.0, "ckpt": f"{ck}/epoch=0-step=2.ckpt", "op": "gone", "size": 0}])
    assert not lt.ckpt and "5.0s apart" in lt.rhythm and lt.active_at(15.5) is None
    last = Pauses(5.0)  # save_last=True: the step file and last.ckpt of one save are one save
    for t in (10.0, 40.0):
        last.on_ckpt_events([{"t": t, "ckpt": f"{ck}/epoch=0-step={int(t)}.ckpt", "op": "new", "size": 1},
                             {"t": t + 0.2, "ckpt": f"{ck}/last.ckpt",
                              "op": "new" if t == 10.0 else "changed", "size": 1}])
    assert last.ckpt and last.rhythm is None and last.count == 2
    ng = Pauses(5.0)  # nanoGPT: out/ckpt.pt rewritten in place every 5 s
    ng.on_ckpt_events([{"t": 10.0, "ckpt": "out/ckpt.pt", "op": "new", "size": 1}])
    ng.on_ckpt_events([{"t": 15.0, "ckpt": "out/ckpt.pt", "op": "changed", "size": 2}])
    assert not ng.ckpt and ng.rhythm and ng.active_at(16.0) is None
    big = Pauses(5.0)  # one file written for 20 s, a change seen every 0.5 s: one save, paused throughout
    big.on_ckpt_events([{"t": 10.0 + 0.5 * i, "ckpt": "out/ckpt.pt", "op": "new" if i == 0 else "changed",
                         "size": i + 1} for i in range(41)])
    assert big.ckpt and big.rhythm is None and big.count == 1 and big.active_at(29.0) is not None
    assert QUIET > 0.5  # longer than the register's polls (a write in progress is seen every poll)


def test_a_proving_span_shorter_than_the_time_window_never_proves_a_profile():
    """The rule behind spec/throughput.py's refusal of ``good_after`` < a time window: the
    span must hold one full window, so 5 s of steady samples under a 10 s window prove
    nothing however long the run goes on; 10 s do."""
    steady = series([2000] * 400, hz=2.0, t0=0.0)
    never = PolicyConfig(min=1000, window="10s", good_after=5.0)
    assert known_good(never, steady, 200.0, 0.0, None) is None
    assert known_good(PolicyConfig(min=1000, window="10s", good_after=10.0), steady, 200.0, 0.0, None) == 2000
