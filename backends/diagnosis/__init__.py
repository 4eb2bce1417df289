"""Diagnosis: which ops compute differently by themselves, and which arithmetic contract each one ran."""
