"""Model code of the reference workspace (a user's training code)."""
