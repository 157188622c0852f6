"""What a saved compiled step depends on: its key.

An AOTInductor library is machine code specialised for everything below; loading one built under
any other value would compute wrong numbers or crash the process (an AVX-512 kernel on an AVX2
cap: seen as heap corruption with Inductor's own cache, see graphs/compile_modes.py). So each field is
both in the artifact's folder name (a digest of all of them) and in its manifest (checked again
on load: a folder copied or renamed into place is refused, not trusted by its name).

  graph    which step: "decode", "verify-q5" (the verify step with 5 queries a row)
  model    the weights as the compiled code holds them (frozen into constants): their fingerprint
  layout   what the config shapes in the traced graph besides the weights: the model side's
           description (architecture, dtypes, attention backend, the KV pool's block layout)
  code     a digest of the source the graph traces or calls
  mode     the torch.compile mode the library was built like, and whether weights were frozen
  torch    torch's version and commit: the library's calling convention and kernels
  isa      the CPU cap ATen and Inductor vectorise for (ATEN_CPU_CAPABILITY lowers it), and the
           CPU's vector flags (an AMX or AVX-512 kernel must not run where they are absent)
  threads  torch's intra-op threads: Inductor writes the OpenMP thread count into the code

`code`, `torch` and `format` are what an upgrade changes (SUPERSEDING): an artifact that differs
from a new one in those alone is never loaded again (graphs/aot/store.py prunes it). Any other
field is a variant this host may start with again (another KV dtype, model or thread count).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

FORMAT = "rillet-aot-2"  # bump when the library's inputs or the manifest change (2: `layout`)
SUPERSEDING = frozenset({"code", "torch", "format"})
# the fields every format had: what an artifact of another format is compared on
EVERY_FORMAT = frozenset({"graph", "model", "mode", "isa", "threads"})
# /proc/cpuinfo flags that decide which kernels Inductor may emit (x86 vector and matrix units)
_ISA_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "vnni")


@dataclass(frozen=True)
class ArtifactKey:
    graph: str
    model: str
    layout: str
    code: str
    mode: str
    torch: str
    isa: str
    threads: int
    format: str = FORMAT

    def fields(self) -> dict[str, object]:
        return asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields(), sort_keys=True).encode()).hexdigest()[:20]

    def differs(self, stored: dict[str, object]) -> list[str]:
        """The fields a stored manifest's key has other values for (all of them if it is no key)."""
        mine = self.fields()
        return [k for k in mine if stored.get(k) != mine[k]]

    def supersedes(self, stored: dict[str, object]) -> bool:
        """Whether a stored key is this one's older build: differs in SUPERSEDING fields alone.
        One of another format is judged on EVERY_FORMAT (its other fields meant something else)."""
        differs = set(self.differs(stored))
        if "format" in differs:
            return not differs & EVERY_FORMAT
        return bool(differs) and differs <= SUPERSEDING


def make_key(graph: str, model: str, layout: str, code: str, mode: str) -> ArtifactKey:
    """The key of `graph` in this process: the environment's fields filled in here."""
    return ArtifactKey(graph, model, layout, code, mode, torch_version(), isa(), torch.get_num_threads())


def torch_version() -> str:
    return f"{torch.__version__}+{getattr(torch.version, 'git_version', 'unknown')[:12]}"


def isa() -> str:
    """ATen's CPU cap (what ATEN_CPU_CAPABILITY leaves), the variable itself, and a digest of the
    CPU's vector flags."""
    cap = torch.backends.cpu.get_cpu_capability()
    env = os.environ.get("ATEN_CPU_CAPABILITY") or "-"
    return f"{cap}/env={env}/cpu={_cpu_flags_digest()}"


def _cpu_flags_digest() -> str:
    flags = _cpu_flags()
    return hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12] if flags else platform.machine()


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the machine's name is all there is
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    words = line.partition(":")[2].split()
    return sorted({w for w in words if w.startswith(_ISA_FLAG_PREFIXES)})


def source_digest(roots: list[Path]) -> str:
    """A digest of the .py and .cpp files under `roots` (names and bytes): any edit of the code a
    graph traces or calls (a custom op's kernel) makes another key. Reading them costs ~10 ms."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cpp")):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]
