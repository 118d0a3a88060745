"""gpujob's benchmark: every figure of BENCHMARKS.md, measured through the loopback
Proxmox test bed (real sshd → fake ``pct`` → ``lxc-attach`` into a real LXC
container), each against its baseline in the same run.

    python -m bench                     # the full run (~6 min on 2 cores)
    python -m bench --quick             # small sizes, one repetition (~1 min)
    python -m bench --json bench/results.json

See bench/run.py for what each figure measures (harness.py: the stand the figures share;
figs_link.py, figs_job.py: the figures; report.py: the values and the table).
"""
