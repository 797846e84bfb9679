"""The core's default plugins; each is registered exactly like a third-party plugin."""
