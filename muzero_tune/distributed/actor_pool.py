"""The async pipeline's actors: a pool of collector and evaluator slots and their health.

What this module owns
    :class:`ActorPool`: creating each slot's Ray actor in its placement-group bundle, waiting for the
    actors to answer their first ping (with ``actor_start_timeout_s``), evaluators that finish booting while
    training runs, replacing a failed or hung actor (``max_actor_restarts``, ``actor_restart_delay_s``; a
    replacement that dies before answering is started again within the same deadline), and closing every
    actor at shutdown (``shutdown_timeout_s``, then killed). It counts failures and restarts in the driver's
    :class:`~muzero_tune.distributed.async_driver.AsyncStats`.

It knows nothing of what the actors are asked to do: launches, results and their timeouts are the driver's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from muzero_tune.distributed.actors import CollectorWorker, EvaluatorWorker
from muzero_tune.distributed.placement import ActorPlacement, describe_shortfall


class ActorFailureError(RuntimeError):
    """An actor slot exhausted its restarts; the run stopped (its checkpoints are intact)."""


@dataclass
class ActorSlot:
    """One actor position (collector i or evaluator j) and its current incarnation."""

    kind: str  # "collector" or "evaluator"
    index: int
    bundle: int  # its placement-group bundle
    handle: Any = None  # the Ray actor handle of the current incarnation (None before it is created)
    incarnation: int = 0
    restarts: int = 0
    busy_s: float = 0.0  # seconds of work handed to it so far (the driver adds each launch's)


class ActorPool:
    """The collector and evaluator slots of one run (see the module docstring).

    ``ray``: the ``ray`` module or a ``LocalRay``; ``ap``: the resolved ``policy.async_pipeline`` settings;
    ``flat_config``: the run's config as dotted keys (each actor builds its policy from it); ``where()``:
    how far the run got, for the message that stops it when a slot's restarts are exhausted.
    """

    def __init__(
        self,
        ray: Any,
        ap: Any,
        flat_config: dict,
        placement: ActorPlacement | None,
        *,
        stats: Any,
        fault: Any = None,
        where: Callable[[], str] = lambda: "",
        describe_resources: Callable[[], str] = lambda: "",
    ):
        from muzero_tune.envs.factory import creators_for

        self.ray, self.ap, self.flat_config, self.placement = ray, ap, flat_config, placement
        self.env_creators = creators_for(flat_config["env.env_id"])  # an env registered from Python
        self.stats, self.fault, self.where, self.describe_resources = stats, fault, where, describe_resources
        # the Ray actor class of each kind (a benchmark may stand another class in for one)
        self.remote_classes = {
            "collector": ray.remote(CollectorWorker), "evaluator": ray.remote(EvaluatorWorker)
        }
        self.collectors = [ActorSlot("collector", i, 0) for i in range(ap.num_collector_actors)]
        self.evaluators = [ActorSlot("evaluator", j, 0) for j in range(ap.num_evaluator_actors)]
        self.actor_info: list[dict] = []  # ping answers: the collectors, then each evaluator once started
        # evaluators still booting (ping ref -> slot) and the time by which they must have answered
        self.booting: dict[Any, ActorSlot] = {}
        self._start_deadline = 0.0

    @property
    def slots(self) -> list[ActorSlot]:
        return self.collectors + self.evaluators

    # ------------------------------------------------------------------ start-up

    def spawn(self, slot: ActorSlot) -> None:
        """Create the slot's actor (a new incarnation) in its bundle; returns at once, the actor boots on
        its own and gets the current weights with its next launch."""
        ap = self.ap
        collector = slot.kind == "collector"
        cpus = ap.collector_num_cpus if collector else ap.evaluator_num_cpus
        gpus = ap.collector_num_gpus if collector else ap.evaluator_num_gpus
        pl = self.placement
        slot.bundle = pl.collector_bundle(slot.index) if collector else pl.evaluator_bundle(slot.index)
        opts = {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": 0, "max_concurrency": 1,
                **self.placement.options(slot.bundle)}  # fmt: skip
        slot.handle = (
            self.remote_classes[slot.kind]
            .options(**opts)
            .remote(self.flat_config, slot.index, slot.incarnation, self.fault, gpus, self.env_creators)
        )

    def spawn_all(self, slots: list[ActorSlot] | None = None) -> None:
        """Create an actor for each of ``slots`` (default: every slot) that has none yet."""
        for s in self.slots if slots is None else slots:
            if s.handle is None:
                self.spawn(s)

    def start(self, *, wait_for_evaluators: bool, before_wait: Callable[[], None] | None = None) -> None:
        """Create every actor not created yet and wait (up to ``actor_start_timeout_s``) until the collectors
        answer a ping, the evaluators too when ``wait_for_evaluators``; otherwise they finish booting while
        training runs (:meth:`take_started`). ``before_wait`` runs once the actors are created and before
        the wait (the driver queues the run's first launches behind the constructors there)."""
        self.spawn_all()
        booting = [] if wait_for_evaluators else self.evaluators
        pings = [s.handle.ping.remote() for s in self.slots if s not in booting]
        self.booting = {s.handle.ping.remote(): s for s in booting}
        self._start_deadline = time.monotonic() + self.ap.actor_start_timeout_s
        if before_wait is not None:
            before_wait()
        ready, _ = self.ray.wait(pings, num_returns=len(pings), timeout=self.ap.actor_start_timeout_s)
        if len(ready) < len(pings):
            self._raise_not_started(len(ready), len(pings))
        self.actor_info = self.ray.get(pings)  # in slot order: collectors, then evaluators

    def take_started(self, timeout: float = 0.0) -> list[ActorSlot]:
        """The booting evaluators that have answered their ping (waiting up to ``timeout``); raises as
        :meth:`start` does when one has not answered by its deadline or failed to start."""
        if not self.booting:
            return []
        ready, _ = self.ray.wait(list(self.booting), num_returns=len(self.booting), timeout=timeout)
        started = []
        for ref in ready:
            slot = self.booting.pop(ref)
            self.actor_info.append(self.ray.get(ref))  # raises if its constructor did
            started.append(slot)
        if self.booting and time.monotonic() >= self._start_deadline:
            n = len(self.slots)
            self._raise_not_started(n - len(self.booting), n)
        return started

    def _raise_not_started(self, started: int, total: int) -> None:
        raise RuntimeError(
            f"only {started} of {total} actors started within "
            f"{self.ap.actor_start_timeout_s:g} s (policy.async_pipeline.actor_start_timeout_s); "
            f"resources: {self.describe_resources()}"
        )

    # ------------------------------------------------------------------ health

    def restart(self, slot: ActorSlot, why: str) -> None:
        """Replace a failed or hung actor and count it; raise :class:`ActorFailureError` once its restarts
        are exhausted or its replacement does not start in time. Returns once the replacement answers."""
        st = self.stats
        st.restart_reasons.append(f"{slot.kind} {slot.index}: {why}")
        # an evaluator that failed while booting: its replacement's start is awaited below, not its ping
        self.booting = {ref: s for ref, s in self.booting.items() if s is not slot}
        if slot.kind == "collector":
            st.collector_failures += 1
        else:
            st.evaluator_failures += 1
        self._kill(slot)
        if slot.restarts >= self.ap.max_actor_restarts:
            raise ActorFailureError(
                f"{slot.kind} actor {slot.index} failed ({why}) and its restarts are exhausted "
                f"({slot.restarts} of policy.async_pipeline.max_actor_restarts="
                f"{self.ap.max_actor_restarts}); "
                f"the run stopped at {self.where()}; its last checkpoint is intact"
            )
        slot.restarts += 1
        slot.incarnation += 1
        if slot.kind == "collector":
            st.collector_restarts += 1
        else:
            st.evaluator_restarts += 1
        # wait until it is up, as start does: a launch's timeout must not count the actor's start-up. A
        # replacement can die before it answers when it was placed on a node that is dying too (its bundle
        # is moved to a live node once Ray marks that node dead): start it again, as part of this restart.
        deadline = time.monotonic() + self.ap.actor_start_timeout_s
        last = ""
        while True:
            time.sleep(self.ap.actor_restart_delay_s)
            self.spawn(slot)
            ping = slot.handle.ping.remote()
            ready, _ = self.ray.wait([ping], timeout=max(0.0, deadline - time.monotonic()))
            if ready:
                try:
                    self.ray.get(ready[0])
                    return
                except Exception as e:
                    st.start_retries += 1
                    last = f"; its last start failed: {type(e).__name__}"
                    self._kill(slot)
            if not ready or time.monotonic() >= deadline:
                raise ActorFailureError(
                    f"{slot.kind} actor {slot.index} was restarted ({why}) but did not start within "
                    f"{self.ap.actor_start_timeout_s:g} s (policy.async_pipeline.actor_start_timeout_s)"
                    f"{last}; its last checkpoint is intact"
                )

    def _kill(self, slot: ActorSlot) -> None:
        try:
            self.ray.kill(slot.handle, no_restart=True)
        except Exception:  # already dead
            pass

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Ask every actor to close, wait up to ``shutdown_timeout_s``, then kill them all."""
        slots = [s for s in self.slots if s.handle is not None]
        refs = []
        for s in slots:
            try:
                refs.append(s.handle.close.remote())
            except Exception:
                pass
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=self.ap.shutdown_timeout_s)
        for s in slots:
            self._kill(s)


def resource_shortfall(cfg) -> str:
    """What the run's bundles ask for against what the cluster has (for start-up errors)."""
    from muzero_tune.distributed.placement import bundles

    return describe_shortfall(bundles(cfg))
