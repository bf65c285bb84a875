"""Placement policies for the tier manager (ssdemu/llm/tiers.py), each a small module behind
one interface (base.Policy).  POLICIES maps each name to its class."""

from ssdemu.llm.policies.base import Policy
from ssdemu.llm.policies.contiguity import Contiguity
from ssdemu.llm.policies.drive_select import DriveSelect
from ssdemu.llm.policies.h2o import H2O
from ssdemu.llm.policies.predictive import Predictive
from ssdemu.llm.policies.qevict import QEvict, QEvict2Bit
from ssdemu.llm.policies.random_control import RandomControl
from ssdemu.llm.policies.streaming import StreamingLLM

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (
    StreamingLLM, H2O, RandomControl, Contiguity, DriveSelect, QEvict, QEvict2Bit, Predictive)}

__all__ = ["POLICIES", "Policy"]
