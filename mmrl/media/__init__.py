"""Image-side helpers shared by tasks, rewards and policies (coordinates, resizing)."""
