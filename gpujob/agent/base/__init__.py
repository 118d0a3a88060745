"""The agent's ground floor: what both sides share. The protocol (states, verdicts, failure
signals, exit codes, the launcher), the spec's defaults, the placeholders of spec commands,
the keeper of processes (proc), the environment a job's phases get, the durable stage and
its transitions, the file primitives (fsio: atomic writes, whole-record appends), the venv
layout and build commands of wheel profiles (envs), what the plan shows and the supervisor
runs (planshare), the trace format and where a checkpoint may point. Stdlib only; imports
nothing above it. With ``judge`` the only wing the laptop side imports.
"""
