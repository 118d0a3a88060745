"""The agent's judgment: pure code over values (no disk, no processes; an ``Outcome``
stamps when it was decided, and replay reads a trace through ``base.trace``). The
throughput parsers and their sources over lines, the rollback policy and its pauses,
failure signals of a trainer's output, per-rank lines, the rules of checkpoints, the
timings of a rollback, an ``Outcome`` of a phase run and what the supervisor does after
it (decide), and ``gpujob replay``'s engine over recorded records. Imports ``base`` only
(never ``home``); the laptop side imports it to show and to replay what the agent decides.
"""
