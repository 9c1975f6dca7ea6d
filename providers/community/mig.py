"""The MIG (Multi-Instance GPU) profiles a machine's listing may offer, per GPU model, and where each fits.

Facts from NVIDIA's Multi-Instance GPU User Guide (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/):

- "Supported MIG Profiles": an A100 40GB offers 1g.5gb to 7g.40gb; the 80 GB A100 and the H100 80GB name the
  same slices after their memory (1g.10gb to 7g.80gb). A profile ``Ng.Mgb`` has N of the GPU's 7 compute
  slices ("Fraction of SMs" N/7) and M GB of memory, and the table's "Number of Instances Available" caps how
  many fit on one GPU (7, 4, 3, 2, 1, 1 for the six profiles below, in order).
- "Getting Started with MIG", ``nvidia-smi mig -lgipp``: a GPU instance occupies a run of the GPU's 8 memory
  slices, starting only at the placements the profile lists (``{0,4}:4`` for a 3g: 4 slices from slice 0 or
  slice 4); NVML's ``nvmlGpuInstancePlacement_t`` defines ``start`` and ``size`` in memory slices, and a new
  GPU instance fails when it overlaps one already there.

The broker and the host agent both place slices with ``mig_place`` (packed onto the fullest GPU, at the lowest
free placement), so the memory slices the broker holds are the ones the agent counts. Media-extension variants
(``+me``) are left out: the broker does not sell decoders apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from providers import gpu_names

COMPUTE_SLICES = 7  # a whole GPU, in compute slices ("Fraction of SMs" is N/7)
MEMORY_SLICES = 8  # a whole GPU, in memory slices: the unit of a placement
MIG_PROFILE = "mig_profile"  # OfferQuote.extra key: the profile a slice offer sells (none: whole GPUs)


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile on one GPU family: its compute and memory slices, where it may start, and how many fit
    on one GPU."""

    name: str
    compute_slices: int
    memory_slices: int
    placements: tuple[int, ...]  # the memory slice each instance may start at
    instances: int  # NVIDIA's "Number of Instances Available" on one GPU

    @property
    def memory_gb(self) -> int:
        """The memory its name promises (``3g.40gb``: 40)."""
        return int(self.name.partition(".")[2].removesuffix("gb"))

    @property
    def share(self) -> Fraction:
        """The share of the card's compute it is: N/7 for an ``Ng`` profile."""
        return Fraction(self.compute_slices, COMPUTE_SLICES)

    @property
    def per_gpu(self) -> int:
        """How many fit on one free GPU: 7 // N by compute, capped by NVIDIA's count for the profile (the 1g
        with twice the memory fits 4 times, not 7)."""
        return min(COMPUTE_SLICES // self.compute_slices, self.instances)

    def slots(self, start: int) -> range:
        """The memory slices an instance starting at ``start`` occupies."""
        return range(start, start + self.memory_slices)

    def place(self, taken: set[int]) -> int | None:
        """The lowest placement whose memory slices are all free of ``taken``, or None when none is."""
        for start in self.placements:
            if taken.isdisjoint(self.slots(start)):
                return start
        return None

    def fits(self, taken: set[int]) -> int:
        """How many more instances of this profile fit beside ``taken`` (lowest placements first, which for
        one profile's equal, aligned runs is the most there can be)."""
        taken, count = set(taken), 0
        while (start := self.place(taken)) is not None:
            taken.update(self.slots(start))
            count += 1
        return count


def mig_place(taken: dict[int, set[int]], profile: MigProfile, gpu_count: int) -> tuple[int, int] | None:
    """Where a new ``profile`` slice goes on a machine whose GPUs have the memory slices ``taken`` (all eight
    for a GPU leased whole): (GPU index, first memory slice) on the fullest GPU already partly sliced where it
    fits (the lowest index among equals), else on the lowest GPU nothing is held on; None when no GPU has
    room. Slices pack, so whole GPUs stay free for whole leases; broker and agent choose alike."""
    partly = sorted((-len(slots), index) for index, slots in taken.items() if slots and 0 <= index < gpu_count)
    for _, index in partly:
        start = profile.place(taken[index])
        if start is not None:
            return index, start
    for index in range(gpu_count):
        if not taken.get(index):
            start = profile.place(set())
            return None if start is None else (index, start)
    return None


# Each family's six profiles share one geometry, in the guide's order: 1 compute slice with 1 memory slice,
# 1 with 2, 2 with 2, 3 with 4, 4 with 4, 7 with all 8; the placements are ``nvidia-smi mig -lgipp``'s.
_GEOMETRY = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    (1, 2, (0, 2, 4, 6), 4),
    (2, 2, (0, 2, 4), 3),
    (3, 4, (0, 4), 2),
    (4, 4, (0,), 1),
    (7, 8, (0,), 1),
)


def _family(*names: str) -> dict[str, MigProfile]:
    return {name: MigProfile(name, *shape) for name, shape in zip(names, _GEOMETRY, strict=True)}


_A100_40 = _family("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_80GB = _family("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")

MIG_TABLES: dict[str, dict[str, MigProfile]] = {
    gpu_names.A100_40_SXM: _A100_40,
    gpu_names.A100_40_PCIE: _A100_40,
    gpu_names.A100_80_SXM: _80GB,
    gpu_names.A100_80_PCIE: _80GB,
    gpu_names.H100_SXM: _80GB,
    gpu_names.H100_PCIE: _80GB,
}
MIG_PROFILES: dict[str, tuple[str, ...]] = {model: tuple(table) for model, table in MIG_TABLES.items()}
# What a host agent knows of its GPUs is their memory (nvidia-smi's, or ``--simulate``'s), not the broker's
# model key: the two families differ there, and "1g.10gb" is a different slice in each.
_BY_MEMORY_GB = {40: _A100_40, 80: _80GB}


def mig_profile(gpu_model: str, name: str) -> MigProfile | None:
    """The profile ``name`` on a ``gpu_model`` GPU (the broker's model key), or None when it has no such one."""
    return MIG_TABLES.get(gpu_model, {}).get(name)


def mig_table_for_memory(memory_gb: int) -> dict[str, MigProfile]:
    """The profiles of a MIG-capable GPU with ``memory_gb`` of memory, as a host agent sees it (empty when
    the guide lists none for that size)."""
    return _BY_MEMORY_GB.get(memory_gb, {})


def mig_profiles_problem(gpu_model: str, profiles: list[str]) -> str | None:
    """Why ``profiles`` cannot be listed on a ``gpu_model`` machine, or None when they can (none always can)."""
    if not profiles:
        return None
    known = MIG_PROFILES.get(gpu_model)
    if known is None:
        return f"a {gpu_model} is not partitioned with MIG here; leave the profiles empty"
    unknown = [p for p in profiles if p not in known]
    if unknown:
        return f"a {gpu_model} offers {', '.join(known)}; not {', '.join(unknown)}"
    if len(set(profiles)) != len(profiles):
        return "each profile once"
    return None
