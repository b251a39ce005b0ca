"""Built-in task plugins (installed as ``mmrl.tasks``); each module registers its tasks."""
