"""The engine: a Session (session.py) owns the plan cache and the configuration and realizes lazy
graphs (program -> saturation -> extraction -> plan -> device: core.py); validate.py checks results.

The module functions and attributes act on the current session (``current_session()``: the one a
``with session:`` block made current in this thread, else ``default_session()``): ``realize``,
``plan_for``, ``clear_cache``, and ``last_plan`` (this thread's), ``_plan_cache``, ``capture_hooks``
(this thread's). docs/engine.md.
"""
from eqgrad.counters import EqgradWarning, GlobalCounters
from eqgrad.engine import core, session
from eqgrad.engine.core import CompiledPlan, PlanCache, compile_plan, time_plan
from eqgrad.engine.session import (CaptureHook, Session, clear_cache, current_session, default_session, plan_for,
                                   realize)
from eqgrad.engine.validate import NOT_A_RULE, ValidationError, blame_rules, reference, validate

__all__ = ["core", "session", "CaptureHook", "CompiledPlan", "EqgradWarning", "GlobalCounters", "NOT_A_RULE",
           "PlanCache", "Session", "ValidationError", "blame_rules", "clear_cache", "compile_plan", "current_session", "default_session",
           "plan_for", "realize", "reference", "time_plan", "validate"]

# module attribute -> the current session's attribute of that name
_SESSION_ATTRS = {"last_plan": "last_plan", "_plan_cache": "plan_cache", "capture_hooks": "capture_hooks"}


def __getattr__(name: str):
    if name in _SESSION_ATTRS:
        return getattr(current_session(), _SESSION_ATTRS[name])
    raise AttributeError(f"module 'eqgrad.engine' has no attribute {name!r}")
