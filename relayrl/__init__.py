"""relayrl: RL post-training for LLMs."""
