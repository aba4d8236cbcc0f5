"""A local GitHub stand-in for the demo, the tests and the benchmarks (DESIGN §5)."""

from bot.sandbox.app import Sandbox
from bot.sandbox.scenario import BUNDLED_SCENARIO, ScenarioError, load_scenario
from bot.sandbox.state import SandboxError

__all__ = ["BUNDLED_SCENARIO", "Sandbox", "SandboxError", "ScenarioError", "load_scenario"]
