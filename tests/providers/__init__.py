"""Provider adapter and sandbox tests."""
