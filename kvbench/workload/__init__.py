"""Workloads: length distributions, trace files, scenario files and request streams."""
