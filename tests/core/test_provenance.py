"""A run says which machine produced its numbers: CPU model, instruction-set level, cores."""

from __future__ import annotations

import os

import torch

from harness.core.provenance import machine_tags, machine_text


def test_the_isa_level_is_the_one_torch_dispatches_on():
    tags = machine_tags()
    assert tags["machine.isa"] == torch.backends.cpu.get_cpu_capability()
    assert tags["machine.cores"] == str(os.cpu_count())
    assert tags["machine.cpu"] and tags["machine.cpu"] != "unknown"


def test_one_line_for_a_reader():
    tags = {
        "machine.cpu": "AMD EPYC 7B13",
        "machine.isa": "AVX2",
        "machine.cores": "2",
        "machine.torch_threads": "1",
        "machine.device": "cpu",
    }
    assert machine_text(tags) == "AMD EPYC 7B13, AVX2, 2 cores, 1 torch thread, cpu"
    assert machine_text({**tags, "machine.torch_threads": "4"}).endswith("4 torch threads, cpu")
    assert machine_text({}) == "unknown"
