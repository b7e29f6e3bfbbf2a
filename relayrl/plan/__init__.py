"""Placement planner (``relayrl plan``): predict step time and throughput of layouts from a profile."""

from relayrl.plan.model import Layout, Prediction, Profile, layouts, overrides, predict, rank

__all__ = ["Layout", "Prediction", "Profile", "layouts", "overrides", "predict", "rank"]
