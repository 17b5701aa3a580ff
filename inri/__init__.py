"""INRI: Independent Notification Relay Infrastructure."""

__version__ = "0.1.0"
