"""Infrastructure failures: a call lost for reasons outside its config.

Ray's memory monitor killing a worker because another process filled the node, a node that
died or was preempted, a raylet gone, a result lost with its node: none of these says anything
about the config the worker ran. The Ray runner retries such a call with backoff
(INFRA_BACKOFF_S), never records it as the config's failure, never tells it to the sampler, and
gives it up as interrupted (no budget spent, the config free) after INFRA_TRIES.

A worker process that died with no such cause (a segfault, SIGKILL from the kernel's OOM killer,
which Ray cannot tell apart) stays the runner's "retry once, then it is the config" case. A
config that exhausts device memory itself raises inside the engine (CuPy's OutOfMemoryError,
VK_ERROR_OUT_OF_DEVICE_MEMORY) and the worker records that trial as the config's crash
(worker.failures).
"""

from __future__ import annotations

INFRA_TRIES = 5  # sends of one call lost to infrastructure before it is given up
INFRA_LOSSES_IN_A_ROW = 8  # a worker lost so often in a row, with no good result, is retired
INFRA_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # before a worker lost so is started again

# Words in a RayActorError's text that name a cause outside the config (Ray 2.x wording).
_OUTSIDE = (
    ("NODE_OUT_OF_MEMORY", "killed by Ray's memory monitor (the node ran low on memory)"),
    ("running low on memory", "killed by Ray's memory monitor (the node ran low on memory)"),
    ("node has died", "its node died"),
    ("node died", "its node died"),
    ("preempted", "its node was preempted"),
)


def infrastructure_cause(e: BaseException) -> str | None:
    """Why the call that raised ``e`` was lost to infrastructure, in a few words; None when
    ``e`` may be the config's doing (an error raised in the engine, or a worker that died with
    no outside cause Ray could name)."""
    import ray.exceptions as rex

    if isinstance(e, rex.RayTaskError):  # raised inside the worker's code: the engine's
        return None
    if isinstance(e, rex.OutOfMemoryError):
        return "killed by Ray's memory monitor (the node ran low on memory)"
    if isinstance(e, (rex.NodeDiedError, rex.LocalRayletDiedError)):
        return "its node died"
    if isinstance(e, rex.ObjectLostError):  # OwnerDiedError and the like
        return "its result was lost with its node"
    if isinstance(e, rex.ActorUnavailableError):  # Ray 2.60, a node removed under a running
        return "its worker was unreachable"  # call: "RpcError: ... Socket closed" (checked)
    if isinstance(e, rex.RayActorError):
        if e.preempted:
            return "its node was preempted"
        text = str(e)
        for words, why in _OUTSIDE:
            if words.lower() in text.lower():
                return why
    return None


def backoff_s(losses: int) -> float:
    """Seconds before a worker lost to infrastructure ``losses`` times in a row starts again."""
    return INFRA_BACKOFF_S[min(max(losses, 1), len(INFRA_BACKOFF_S)) - 1]
