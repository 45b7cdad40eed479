"""Roofline, memory and capacity planning: `make_plan(resolve_model(m), resolve_hardware(h), Workload(...))`."""

from tokenomy.plan.planner import Plan, PlanInputError, make_plan
from tokenomy.plan.presets import PresetError, resolve_hardware, resolve_model
from tokenomy.plan.specs import HardwareSpec, ModelShape, Workload

__all__ = ["HardwareSpec", "ModelShape", "Plan", "PresetError", "Workload", "PlanInputError", "make_plan",
           "resolve_hardware", "resolve_model"]
