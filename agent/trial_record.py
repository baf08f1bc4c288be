"""What one evaluation becomes in its study: the ``TrialRecord`` the agent tells (from the call
that was sent, the worker's result, the acceptance decision and its confirmation)."""

from __future__ import annotations

import time

from agent.acceptance import Decision
from agent.dispatch import Pending
from agent.records import Confirmation, TrialRecord
from worker.records import EvalResult, Outcome


def confirmation_ok(conf: Confirmation | None) -> bool:
    return conf is None or conf.accepted


def trial_record(
    p: Pending,
    res: EvalResult | None,
    outcome: Outcome,
    reason: str,
    overhead: float,
    decision: Decision | None = None,
    confirmation: Confirmation | None = None,
) -> TrialRecord:
    """The record of ``p``'s trial; ``res`` None: no result came back (lost, stopped)."""
    st = p.study
    assert st is not None
    info = res.worker if res is not None and res.worker else p.slot.info
    base = st.baseline
    changed = {k: [base.get(k), v] for k, v in p.flat.items() if base.get(k) != v}
    est = dict(decision.estimates) if decision else {}
    return TrialRecord(
        study=st.name,
        trial=p.trial.number,
        role=p.role,
        outcome=outcome,
        reason=reason,
        config=dict(p.flat),
        changed=changed,
        paired_against=p.paired_against,
        metrics=res.medians() if res is not None and res.ok else {},
        samples={s.objective: s for s in res.samples} if res else {},
        estimates=est,
        accepted=bool(decision and decision.accepted and confirmation_ok(confirmation)),
        decision=decision.verdict() if decision else None,
        confirmation=confirmation,
        validate=res.validate if res else None,
        worker=info,
        host=info.host if info else "",
        device=info.device_name if info else "",
        driver=info.driver if info else "",
        engine_commit=info.engine_commit if info else "",
        started=res.started if res else 0.0,
        finished=res.finished if res else time.time(),
        wall_s=res.wall_s if res else 0.0,
        phase_s=dict(res.phase_s) if res else {},
        overhead_s=overhead,
        gpu=res.gpu if res else None,
        revalidation=res.revalidation if res else None,
        memory=res.memory if res else None,
    )


def baseline_reason(res: EvalResult) -> str:
    """A baseline trial's reason: plain, or what became of its promoted config's re-validation."""
    rv = res.revalidation
    if not rv:
        return "baseline"
    if rv.get("revalidated"):
        return f"baseline: promoted config re-validated ({'; '.join(rv['changes'])})"
    return "baseline: promoted config under its sentinel key, not re-validated"
