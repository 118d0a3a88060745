"""What the controller says of a job name's ledger around ``submit``: the known-good profiles
that this spec does not list (never a rollback target) and, in --plan, where a rollback goes."""

from __future__ import annotations


def rollback_target_note(spec) -> list:
    """--plan: where an automatic rollback goes (read from the container's ledger when it happens)."""
    from gpujob.steps import Step
    if not spec.rollback.enabled or len(spec.profiles) < 2:
        return []
    return [Step("note", "supervisor", f"a rollback goes to the newest known-good profile of the ledger of "
                 f"{spec.name} among this spec's profiles ({', '.join(p.name for p in spec.profiles)}), else "
                 f"rollback.fallback; a known-good profile of that ledger this spec does not list is passed "
                 f"over (submit names them)")]


def unlisted_goods_lines(led: dict, name: str, profiles: list) -> list:
    """The known-good profiles of a job name's ledger that this spec does not list: never a
    rollback target of this job (agent/judge/decide.py pick)."""
    from gpujob.agent.judge.decide import unlisted_goods
    goods = unlisted_goods(led, profiles)
    return [f"· known-good in the ledger of {name} but not a profile of this spec (never rolled back to): "
            f"{', '.join(goods)}"] if goods else []
