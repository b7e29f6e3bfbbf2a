"""Placement planner (``relayrl plan``): predict step time and throughput of layouts from a profile."""

from relayrl.plan.model import Layout, Prediction, layouts, overrides, predict, rank
from relayrl.plan.profile import Profile

__all__ = ["Layout", "Prediction", "Profile", "layouts", "overrides", "predict", "rank"]
