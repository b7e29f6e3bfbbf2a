"""Placement planner (``relayrl plan``): step time and throughput of layouts from a profile, ranked by the
simulator fed the profile's costs (``calibrate.rank``); ``predict`` gives the closed-form laws' figure."""

from relayrl.plan.calibrate import rank
from relayrl.plan.model import Layout, Prediction, layouts, overrides, predict
from relayrl.plan.profile import Profile

__all__ = ["Layout", "Prediction", "Profile", "layouts", "overrides", "predict", "rank"]
