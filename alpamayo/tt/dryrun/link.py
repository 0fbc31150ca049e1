"""The link step of the dry run's stand-in for SFPI's `riscv-tt-elf-g++` (`alpamayo.tt.dryrun`).

tt-metal JIT-compiles firmware and every op's kernels before it opens or runs anything, mock device included,
and reads back what the link produced: the segments it lays out in L1, the firmware's exported symbols that
kernels link against, the text relocations it rewrites. Kernels never run on the mock, so the code does not
matter, but what tt-metal reads must be well formed. Called with the link's command line, this writes at `-o`
a minimal RV32 little-endian ELF executable with one text and one data `PT_LOAD`, at the `.text` and `.data`
addresses that the linker script (`-T`) gives (the data loaded right after the text where the script says
`AT(...)`, as the kernel scripts do), a symbol table exporting `_start`, `__fw_export_text_end`,
`__fw_export_ldm_end` and `__ldm_data_start`, and an empty `.rela.text`. Kernel scripts place `.text` and
`.data` at the firmware's `__fw_export_*` symbols, read from the ELF passed with `-Wl,--just-symbols=`.

The output depends on the script and that ELF only, which lets the stand-in's shell front end cache it.
Standard library only: it runs as `python -S -I link.py ARGS...` (a bare interpreter starts fastest).
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

EM_RISCV = 243
ET_EXEC = 2
PT_LOAD = 1
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA = 1, 2, 3, 4
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
STB_GLOBAL, STT_NOTYPE, STT_FUNC = 1, 0, 2
SHN_ABS = 0xFFF1
# One 4-byte instruction of text and one word of data: segments must not be empty for tt-metal to load them.
TEXT = struct.pack("<I", 0x00008067)  # `ret`
DATA = b"\0" * 4
SECTION_ADDRESS = r"^\s*\.{name}\s+(?P<expr>[^:]+?)\s*:(?:\s*AT\((?P<lma>[^)]+)\))?"


def evaluate(expr: str, symbols: dict[str, int]) -> int:
    """A linker-script address expression (integers, + - * / & ~ and parentheses, named symbols) as an int."""
    names = re.findall(r"(?<![\w.$])[A-Za-z_.$][\w.$]*", expr)
    for name in sorted(set(names), key=len, reverse=True):
        if name not in symbols:
            raise ValueError(f"linker script address {expr!r}: symbol {name} is not defined")
        expr = re.sub(rf"(?<![\w.$]){re.escape(name)}(?![\w.$])", str(symbols[name]), expr)
    if not re.fullmatch(r"[\s\d()+\-*/&|~xXa-fA-F]*", expr):
        raise ValueError(f"linker script address {expr!r}: not an integer expression")
    return int(eval(expr.replace("/", "//"), {"__builtins__": {}})) & 0xFFFFFFFF


def section_address(script: str, name: str, symbols: dict[str, int]) -> tuple[int, int]:
    """The (run, load) addresses of output section `name`; they differ where the script says `AT(...)`."""
    match = re.search(SECTION_ADDRESS.format(name=name), script, re.MULTILINE)
    if match is None:
        raise ValueError(f"linker script has no .{name} section with an address")
    vma = evaluate(match.group("expr"), symbols)
    return vma, evaluate(match.group("lma"), symbols) if match.group("lma") else vma


def read_symbols(path: str) -> dict[str, int]:
    """Name -> value of every symbol in an ELF32 file's symbol table (the firmware a kernel links against)."""
    data = Path(path).read_bytes()
    shoff, shentsize, shnum = struct.unpack_from("<I", data, 32)[0], *struct.unpack_from("<HH", data, 46)
    sections = [struct.unpack_from("<IIIIIIIIII", data, shoff + i * shentsize) for i in range(shnum)]
    symbols = {}
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != SHT_SYMTAB:
            continue
        strtab = sections[link]
        for at in range(offset + entsize, offset + size, entsize):
            st_name, st_value = struct.unpack_from("<II", data, at)
            start = strtab[4] + st_name
            symbols[data[start : data.index(b"\0", start)].decode()] = st_value
    return symbols


def elf(text_addr: int, data_addr: int, data_lma: int, symbols: dict[str, tuple[int, int, int]]) -> bytes:
    """A minimal RV32 ELF executable: text and data `PT_LOAD`s at the given addresses (the data loaded at
    `data_lma`); symbols name -> (value, section index, type); an empty `.rela.text`."""
    shstr = b"\0.text\0.data\0.rela.text\0.symtab\0.strtab\0.shstrtab\0"
    strtab, symtab = b"\0", struct.pack("<IIIBBH", 0, 0, 0, 0, 0, 0)
    for name, (value, shndx, kind) in symbols.items():
        symtab += struct.pack("<IIIBBH", len(strtab), value, 0, (STB_GLOBAL << 4) | kind, 0, shndx)
        strtab += name.encode() + b"\0"
    ehsize, phentsize, shentsize = 52, 32, 40
    text_off = ehsize + 2 * phentsize
    data_off = text_off + len(TEXT)
    symtab_off = data_off + len(DATA)
    strtab_off = symtab_off + len(symtab)
    shstr_off = strtab_off + len(strtab)
    shoff = (shstr_off + len(shstr) + 3) & ~3
    header = struct.pack(
        "<4sBBBB8sHHIIIIIHHHHHH",
        b"\x7fELF",
        1,  # ELFCLASS32
        1,  # little endian
        1,  # EV_CURRENT
        0,
        b"",
        ET_EXEC,
        EM_RISCV,
        1,
        text_addr,  # e_entry: _start
        ehsize,
        shoff,
        0,
        ehsize,
        phentsize,
        2,
        shentsize,
        7,
        6,  # .shstrtab
    )
    phdrs = struct.pack(
        "<IIIIIIII", PT_LOAD, text_off, text_addr, text_addr, len(TEXT), len(TEXT), 5, 4
    ) + struct.pack("<IIIIIIII", PT_LOAD, data_off, data_addr, data_lma, len(DATA), len(DATA), 6, 4)

    def sh(
        name: bytes, kind: int, flags: int, addr: int, off: int, size: int, link=0, info=0, align=4, ent=0
    ):
        return struct.pack(
            "<IIIIIIIIII", shstr.index(name + b"\0"), kind, flags, addr, off, size, link, info, align, ent
        )

    sections = (
        b"\0" * shentsize
        + sh(b".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, text_addr, text_off, len(TEXT))
        + sh(b".data", SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, data_addr, data_off, len(DATA))
        + sh(b".rela.text", SHT_RELA, 0, 0, symtab_off, 0, link=4, info=1, ent=12)
        + sh(b".symtab", SHT_SYMTAB, 0, 0, symtab_off, len(symtab), link=5, info=1, ent=16)
        + sh(b".strtab", SHT_STRTAB, 0, 0, strtab_off, len(strtab), align=1)
        + sh(b".shstrtab", SHT_STRTAB, 0, 0, shstr_off, len(shstr), align=1)
    )
    body = header + phdrs + TEXT + DATA + symtab + strtab + shstr
    return body + b"\0" * (shoff - len(body)) + sections


def link(args: list[str], out: str) -> None:
    script_path, symbols = None, {}
    for i, a in enumerate(args):
        if a.startswith("-T"):
            script_path = a[2:] or args[i + 1]
        for opt in a[len("-Wl,") :].split(",") if a.startswith("-Wl,") else ():
            if opt.startswith("--just-symbols="):
                symbols.update(read_symbols(opt.split("=", 1)[1]))
    if script_path is None:
        raise ValueError("link without a linker script (-T)")
    script = Path(script_path).read_text()
    text_addr, _ = section_address(script, "text", symbols)
    text_end = text_addr + len(TEXT)
    # kernel scripts load .data right after the text (`__kernel_data_lma = .;` then `AT(__kernel_data_lma)`)
    text_at = script.find(".text")
    for name in re.findall(r"^\s*([A-Za-z_]\w*)\s*=\s*\.\s*;", script[text_at:], re.MULTILINE):
        symbols.setdefault(name, text_end)
    data_addr, data_lma = section_address(script, "data", symbols)
    data_end = data_addr + len(DATA)
    exported = {
        "_start": (text_addr, 1, STT_FUNC),
        # a firmware exports the ends of its own segments; a kernel passes on the firmware's
        "__fw_export_text_end": (symbols.get("__fw_export_text_end", text_end), SHN_ABS, STT_NOTYPE),
        "__fw_export_ldm_end": (symbols.get("__fw_export_ldm_end", data_end), SHN_ABS, STT_NOTYPE),
        "__ldm_data_start": (data_addr, 2, STT_NOTYPE),
    }
    Path(out).write_bytes(elf(text_addr, data_addr, data_lma, exported))


def main(args: list[str]) -> int:
    if "-o" not in args:
        print(f"riscv-tt-elf-g++ stand-in: no -o in {' '.join(args)}", file=sys.stderr)
        return 1
    try:
        link(args, args[args.index("-o") + 1])
    except (OSError, ValueError, struct.error) as e:
        print(f"riscv-tt-elf-g++ stand-in: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
