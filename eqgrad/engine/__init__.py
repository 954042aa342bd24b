"""The engine: realize() ties the stages together (program -> saturation -> extraction -> plan ->
device), caches compiled plans by structure and validates results. See core.py and validate.py."""
from eqgrad.counters import EqgradWarning, GlobalCounters
from eqgrad.engine import core
from eqgrad.engine.core import (CompiledPlan, PlanCache, capture_hooks, clear_cache, plan_for, realize,
                                structure_key, time_plan)
from eqgrad.engine.validate import NOT_A_RULE, ValidationError, blame_rules, reference, validate

__all__ = ["CompiledPlan", "EqgradWarning", "GlobalCounters", "NOT_A_RULE", "PlanCache", "ValidationError",
           "blame_rules", "capture_hooks", "clear_cache", "plan_for", "realize", "reference", "structure_key",
           "time_plan", "validate"]


def __getattr__(name: str):
    # the plan of the most recent realize, and the plan cache, live in core (rebound on every realize)
    if name in ("last_plan", "_plan_cache"):
        return getattr(core, name)
    raise AttributeError(f"module 'eqgrad.engine' has no attribute {name!r}")
