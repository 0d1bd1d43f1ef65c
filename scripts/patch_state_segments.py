#!/usr/bin/env python3
"""Add ``llama_state_seq_set_data_segments`` to a vendored llama.cpp tree (used by scripts/install_llama.sh).

``llama_state_seq_set_data_ext`` reads a sequence state from one contiguous buffer. ollapy's prompt cache keeps a
state as fixed-size KV blocks plus a tail (:mod:`ollapy.cache.kvstate`), so restoring through that API means
joining the blocks into one buffer first: one more copy of the whole state. The added function takes the state as
an ordered list of ``n_segments`` pieces (``ptrs[i]``, ``sizes[i]`` bytes; together the bytes that
``llama_state_seq_get_data`` wrote) and reads it through a ``llama_io_read_i`` that walks the pieces: header
fields are copied out, and tensor data is handed to ``ggml_backend_tensor_set`` piece by piece from where it lies,
deferred until the read succeeded, as ``llama_io_read_host`` does (a tensor in host memory is then written with
one ``memcpy`` per piece, its bounds checked once per read: a transposed V makes one piece per embedding row per
KV block, tens of thousands for a long state). It returns the bytes read, or 0 on failure
(the sequence is then cleared, as with ``llama_state_seq_set_data_ext``). ``LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`` is
not supported (returns 0).

Usage: patch_state_segments.py LLAMA_CPP_DIR. Exits 1 (without writing anything) when an anchor is not found
exactly once, so that a new llama.cpp version fails loudly instead of building without the function.
"""
from __future__ import annotations

import sys
from pathlib import Path

DECL = """
    // ollapy: like llama_state_seq_set_data_ext, with the state given as n_segments pieces in order
    // (ptrs[i], sizes[i] bytes each); the pieces are read where they lie, without joining them first.
    // Returns the bytes read, 0 on failure. LLAMA_STATE_SEQ_FLAGS_ON_DEVICE is not supported.
    LLAMA_API size_t llama_state_seq_set_data_segments(
            struct llama_context * ctx,
           const uint8_t * const * ptrs,
                    const size_t * sizes,
                          size_t   n_segments,
                    llama_seq_id   dest_seq_id,
           llama_state_seq_flags   flags);
"""

MEMBER = """    size_t state_seq_set_data_segments(llama_seq_id seq_id, const uint8_t * const * ptrs, const size_t * sizes,
                                       size_t n_segments, llama_state_seq_flags flags);
"""

IMPL = """
// ollapy: a reader over a state given as pieces (see llama_state_seq_set_data_segments)
class llama_io_read_segments : public llama_io_read_i {
public:
    llama_io_read_segments(const uint8_t * const * ptrs, const size_t * sizes, size_t n) : ptrs(ptrs), sizes(sizes), n(n) {
        rinfos.reserve(n + 64);  // about one deferred copy per piece
    }

    ~llama_io_read_segments() {
        for (const auto & r : rinfos) {
            if (r.host) {  // a tensor in host memory: bounds checked in read_tensor, copied as its buffer would
                memcpy(r.host + r.offset, r.ptr, r.size);
            } else {
                ggml_backend_tensor_set(r.tensor, r.ptr, r.offset, r.size);
            }
        }
    }

    void read(void * dst, size_t size) override {
        uint8_t * out = (uint8_t *) dst;
        while (size > 0) {
            const size_t k = take(size);
            memcpy(out, ptrs[i] + pos, k);
            out  += k;
            size -= k;
            pos  += k;
            size_read += k;
        }
    }

    void read_tensor(ggml_tensor * tensor, size_t offset, size_t size) override {
        // a transposed V arrives as one read per embedding row, each split into one piece per KV block:
        // the checks ggml_backend_tensor_set makes per call are made here once per read
        ggml_backend_buffer_t buf = tensor->view_src ? tensor->view_src->buffer : tensor->buffer;
        GGML_ASSERT(buf != NULL && tensor->data != NULL && offset + size <= ggml_nbytes(tensor));
        uint8_t * host = ggml_backend_buffer_is_host(buf) ? (uint8_t *) tensor->data : nullptr;
        while (size > 0) {
            const size_t k = take(size);
            rinfos.push_back({tensor, host, ptrs[i] + pos, k, offset});
            offset += k;
            size   -= k;
            pos    += k;
            size_read += k;
        }
    }

    void discard() override {
        rinfos.clear();
    }

    size_t n_bytes() override {
        return size_read;
    }

private:
    // bytes available in the current piece (at most want); moves past exhausted pieces
    size_t take(size_t want) {
        while (i < n && pos == sizes[i]) {
            i++;
            pos = 0;
        }
        if (i >= n) {
            throw std::runtime_error("unexpectedly reached end of segments");
        }
        return std::min(want, sizes[i] - pos);
    }

    const uint8_t * const * ptrs;
    const size_t * sizes;
    size_t n;
    size_t i   = 0;
    size_t pos = 0;
    size_t size_read = 0;

    struct read_info {
        ggml_tensor * tensor;
        uint8_t * host;  // tensor->data when the tensor is in host memory, else null
        const uint8_t * ptr;
        size_t size;
        size_t offset;
    };
    std::vector<read_info> rinfos;
};

size_t llama_context::state_seq_set_data_segments(llama_seq_id seq_id, const uint8_t * const * ptrs, const size_t * sizes,
                                                  size_t n_segments, llama_state_seq_flags flags) {
    if (flags & LLAMA_STATE_SEQ_FLAGS_ON_DEVICE) {
        LLAMA_LOG_ERROR("%s: LLAMA_STATE_SEQ_FLAGS_ON_DEVICE is not supported\\n", __func__);
        return 0;
    }
    llama_io_read_segments io(ptrs, sizes, n_segments);
    try {
        uint32_t magic_read;
        io.read(&magic_read, sizeof(magic_read));
        if (io_magic != magic_read) {
            throw std::runtime_error("wrong sequence state magic");
        }

        llama_seq_id seq_id_read;
        io.read(&seq_id_read, sizeof(seq_id_read));

        return state_seq_read_data(io, seq_id, flags);
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: error loading state: %s\\n", __func__, err.what());
        io.discard();
        return 0;
    }
}

"""

API = """
size_t llama_state_seq_set_data_segments(llama_context * ctx, const uint8_t * const * ptrs, const size_t * sizes,
                                         size_t n_segments, llama_seq_id seq_id, llama_state_seq_flags flags) {
    ctx->synchronize();

    return ctx->state_seq_set_data_segments(seq_id, ptrs, sizes, n_segments, flags);
}
"""


def patch(root: Path) -> None:
    """Patch ``root`` (a llama.cpp tree) in place; SystemExit when an anchor is missing or the tree is patched."""
    header = root / "include" / "llama.h"
    ctx_h = root / "src" / "llama-context.h"
    ctx_cpp = root / "src" / "llama-context.cpp"
    texts = {p: p.read_text() for p in (header, ctx_h, ctx_cpp)}
    if "llama_state_seq_set_data_segments" in texts[header]:
        sys.exit(f"patch_state_segments.py: {header} is already patched")
    edits = [
        (header, "           llama_state_seq_flags   flags);\n\n    //\n    // Decoding\n", "after"),
        (ctx_h, "    size_t state_seq_set_data(llama_seq_id seq_id, const uint8_t * src, size_t size, "
                "llama_state_seq_flags flags);\n", "after"),
        (ctx_cpp, "bool llama_context::state_load_file(const char * filepath, llama_token * tokens_out, "
                  "size_t n_token_capacity, size_t * n_token_count_out) {\n", "before"),
    ]
    inserts = {header: DECL, ctx_h: MEMBER, ctx_cpp: IMPL}
    for path, anchor, where in edits:
        if texts[path].count(anchor) != 1:
            sys.exit(f"patch_state_segments.py: the anchor for {path.name} was not found once; update the patch")
        if path is header:  # the declaration goes after llama_state_seq_set_data_ext's, before "// Decoding"
            cut = texts[path].index(anchor) + len("           llama_state_seq_flags   flags);\n")
        else:
            cut = texts[path].index(anchor) + (len(anchor) if where == "after" else 0)
        texts[path] = texts[path][:cut] + inserts[path] + texts[path][cut:]
    texts[ctx_cpp] += API
    for path, text in texts.items():
        path.write_text(text)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: patch_state_segments.py LLAMA_CPP_DIR")
    patch(Path(sys.argv[1]))
