"""Shared by every benchmark; knows no benchmark."""
