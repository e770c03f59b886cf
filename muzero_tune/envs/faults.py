"""Fault injection for tests and drills: an environment wrapper that fails on chosen actors and steps.

A :class:`FaultSpec` names the actor ids and the window of env steps (counted per actor incarnation) in
which an env fails, and how: ``raise`` an exception from ``step``, ``exit`` the process (as if killed
mid-collect), ``hang`` (sleep far past any timeout), ``exit_on_start`` (the actor's process exits in its
constructor, as on a node that dies while the actor boots) or ``raise_on_start`` (its constructor raises, as
on a setting the actor cannot use); the step window is not used by the last two. Only the listed
incarnations fail, so a restarted actor runs clean. ``after_file_in``, when set, holds the fault back until
that directory holds a file ending in ``after_file_suffix`` (a checkpoint, say), so a drill can order the
fault after an event instead of after a guessed number of steps. Nothing here runs unless a FaultSpec is
passed explicitly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import gymnasium as gym


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws from ``env.step``."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str  # "collector" or "evaluator"
    actor_ids: tuple[int, ...]
    start_step: int  # first failing env step (per actor incarnation, counted over its env 0)
    end_step: int  # last failing env step
    mode: str = "raise"  # raise | exit | hang | exit_on_start | raise_on_start
    incarnations: tuple[int, ...] = (0,)
    after_file_in: str | None = None  # a directory: the fault waits until a matching file is in it
    after_file_suffix: str = ".pt"

    def armed(self) -> bool:
        """True once the gate (if any) is open: ``after_file_in`` holds a file (not a hidden temporary one)
        ending in the suffix."""
        if self.after_file_in is None:
            return True
        try:
            return any(f.endswith(self.after_file_suffix) and not f.startswith(".")
                       for f in os.listdir(self.after_file_in))
        except FileNotFoundError:
            return False

    def applies(self, kind: str, actor_id: int, incarnation: int) -> bool:
        return kind == self.kind and actor_id in self.actor_ids and incarnation in self.incarnations


class FaultyEnv(gym.Wrapper):
    """Fails per ``spec`` once its step counter enters [start_step, end_step]."""

    def __init__(self, env: gym.Env, spec: FaultSpec):
        super().__init__(env)
        self.fault = spec  # not ``self.spec``: gym.Wrapper.spec is a read-only property (the env's EnvSpec)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.fault.start_step <= self.steps <= self.fault.end_step and self.fault.armed():
            if self.fault.mode == "exit":
                os._exit(17)
            if self.fault.mode == "hang":
                time.sleep(3600)
            raise InjectedFault(f"injected fault at env step {self.steps}")
        return self.env.step(action)
