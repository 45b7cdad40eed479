"""Split a GGUF file into parts as llama.cpp's gguf-split does (`NAME-00001-of-0000N.gguf`: every metadata key in
the first part, each part a run of the tensors and its split.no / split.count / split.tensors.count), so tests can
load a real split model without the C++ tool."""

from __future__ import annotations

from pathlib import Path

import gguf


def split(src: Path, folder: Path, stem: str, parts: int = 2) -> list[Path]:
    reader = gguf.GGUFReader(src, "r")
    arch = reader.fields["general.architecture"].contents()
    tensors = list(reader.tensors)
    per = -(-len(tensors) // parts)
    paths = [folder / f"{stem}-{i + 1:05d}-of-{parts:05d}.gguf" for i in range(parts)]
    for i, path in enumerate(paths):
        writer = gguf.GGUFWriter(path, arch, endianess=reader.endianess)
        if i == 0:
            for field in reader.fields.values():
                if field.name == "general.architecture" or field.name.startswith("GGUF."):
                    continue
                kind = field.types[0]
                sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
        writer.add_uint16("split.no", i)
        writer.add_uint16("split.count", parts)
        writer.add_int32("split.tensors.count", len(tensors))
        mine = tensors[i * per:(i + 1) * per]
        for t in mine:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in mine:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
    return paths
