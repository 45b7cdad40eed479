"""Roofline, memory and capacity planning: `make_plan(resolve_model(m), resolve_hardware(h), Workload(...))`."""

from tokenomy.models.shape import ModelShape
from tokenomy.tools.plan.inputs import HardwareSpec, Workload
from tokenomy.tools.plan.planner import Plan, PlanInputError, make_plan
from tokenomy.tools.plan.presets import PresetError, resolve_hardware, resolve_model

__all__ = ["HardwareSpec", "ModelShape", "Plan", "PresetError", "Workload", "PlanInputError", "make_plan",
           "resolve_hardware", "resolve_model"]
