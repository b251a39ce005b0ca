"""mmrl demo: a Gradio app to try a policy, compare before and after RL, watch and launch runs."""
