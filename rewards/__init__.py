"""Built-in reward plugins (installed as ``mmrl.rewards``); each module registers its rewards."""
