"""Controller: the Ray driver, placement, and the training loop (see driver.py for the picture)."""

from relayrl.controller.driver import train

__all__ = ["train"]
