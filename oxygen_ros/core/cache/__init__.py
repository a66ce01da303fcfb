"""Paged K/V cache: block pool bookkeeping (pure Python) and the K/V tensor pool with its attention views.

May import oxygen_ros.core.model (attention views) and core config/types; never engine.
"""
