"""Paged K/V cache: block pool bookkeeping (pure Python) and the K/V tensor pool."""
