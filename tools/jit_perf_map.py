"""Name the XLA CPU plugin's generated kernels in `perf` profiles.

    python tools/jit_perf_map.py PID      # writes /tmp/perf-PID.map

The plugin registers each kernel object it compiles with the GDB JIT
interface (`__jit_debug_descriptor`, a symbol of its .symtab).  This walks
that list in the running process PID and writes perf's map of
"address size name" for every function symbol, so `perf report` shows
`multiply_reduce_fusion` instead of `[JIT] 0x7f...`.  Only kernels compiled
in that process are registered: executables loaded from the disk cache are
not, so profile with `TORCH_PJRT_CACHE_DIR=0`.  Kernel names repeat across
programs; XLA's `--xla_dump_to` shows which program has which.  Reading
/proc/PID/mem needs ptrace rights over PID (the same user, or root).
"""
import struct
import subprocess
import sys


def main(pid):
    so = path = None
    for line in open(f"/proc/{pid}/maps"):
        parts = line.split()
        if len(parts) >= 6 and "xla_cpu_pjrt" in parts[5] and int(parts[2], 16) == 0:
            so, path = int(parts[0].split("-")[0], 16), parts[5]
            break
    if so is None:
        sys.exit(f"process {pid} has not loaded the XLA CPU plugin")
    nm = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    desc = next(int(ln.split()[0], 16) for ln in nm.splitlines() if ln.endswith(" __jit_debug_descriptor"))
    mem = open(f"/proc/{pid}/mem", "rb")

    def read(addr, n):
        mem.seek(addr)
        return mem.read(n)

    _, _, _, entry = struct.unpack("<IIQQ", read(so + desc, 24))
    syms, objects = [], 0
    while entry:
        entry, _, addr, size = struct.unpack("<QQQQ", read(entry, 32))  # next, prev, object, size
        obj = read(addr, size)
        objects += 1
        shoff, = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3a)
        secs = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
        for sec in secs:
            if sec[1] != 2:  # SHT_SYMTAB
                continue
            strtab = secs[sec[6]][4]
            for k in range(sec[5] // 24):
                name, info, _, shndx, value, sz = struct.unpack_from("<IBBHQQ", obj, sec[4] + k * 24)
                if info & 0xF == 2 and 0 < shndx < len(secs) and sz:  # STT_FUNC; sh_addr is the load address
                    end = obj.index(b"\0", strtab + name)
                    syms.append((secs[shndx][3] + value, sz, obj[strtab + name:end].decode()))
    with open(f"/tmp/perf-{pid}.map", "w") as f:
        f.writelines(f"{a:x} {s:x} {n}\n" for a, s, n in syms)
    print(f"/tmp/perf-{pid}.map: {len(syms)} kernels from {objects} objects")


if __name__ == "__main__":
    main(int(sys.argv[1]))
