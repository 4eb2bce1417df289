/* A capture written with libhdf5 alone (1.10 or later), as docs/capture-format.md describes it.
 *
 * Build:  h5cc -o write_capture write_capture.c
 *    or:  cc -o write_capture write_capture.c $(pkg-config --cflags --libs hdf5)
 * Run:    ./write_capture OUT.h5
 *
 * It writes STEPS token steps of a one-layer toy model with the llama.cpp tensor names: per
 * step a bfloat16 `l_out-0`, a float16 `kqv_out-0` with one attention dispatch row, a float32
 * `result_output`, and one token. The step's three tensors are packed: their bytes back to back
 * in one 1-D byte dataset of the step's group, each index row giving its offset and byte count.
 * Every value is a function of (step, element), so a Python twin writes the same bits
 * (tests/test_c_writer.py) and `parity-xray report` finds PARITY.
 * Error handling is reduced to one check per call that creates something: a real engine
 * would report which call failed.
 */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 3
#define ROWS 4
#define COLS 64
#define VOCAB 50
#define PROMPT_BYTES 100000 /* longer than any stack buffer a writer might be tempted to use, and than the 64 KiB an attribute of the earliest file format holds */

static void fail(const char *what) {
    fprintf(stderr, "write_capture: %s failed\n", what);
    exit(1);
}

static hid_t check(hid_t id, const char *what) {
    if (id < 0) fail(what);
    return id;
}

/* string(n): fixed-length, UTF-8, NUL-padded. The caller closes it. */
static hid_t str_type(size_t n) {
    hid_t t = check(H5Tcopy(H5T_C_S1), "H5Tcopy");
    H5Tset_size(t, n);
    H5Tset_cset(t, H5T_CSET_UTF8);
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    return t;
}

/* A scalar string attribute of exactly strlen(value) bytes (one NUL byte when empty); written
 * straight from `value`, which holds at least that many bytes: no copy, no length limit. */
static void str_attr(hid_t obj, const char *name, const char *value) {
    size_t n = strlen(value) ? strlen(value) : 1;
    hid_t t = str_type(n), s = H5Screate(H5S_SCALAR);
    hid_t a = check(H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT), name);
    if (H5Awrite(a, t, value) < 0) fail(name);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

static void int_attr(hid_t obj, const char *name, hid_t file_type, int64_t value) {
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = check(H5Acreate2(obj, name, file_type, s, H5P_DEFAULT, H5P_DEFAULT), name);
    if (H5Awrite(a, H5T_NATIVE_INT64, &value) < 0) fail(name);
    H5Aclose(a);
    H5Sclose(s);
}

/* Overwrite an existing scalar integer attribute in place (never delete and re-create it). */
static void set_int_attr(hid_t obj, const char *name, int64_t value) {
    hid_t a = check(H5Aopen(obj, name, H5P_DEFAULT), name);
    if (H5Awrite(a, H5T_NATIVE_INT64, &value) < 0) fail(name);
    H5Aclose(a);
}

/* Insert a member whose type the caller made: H5Tinsert copies it, so it is closed here. */
static void insert_owned(hid_t compound, const char *name, size_t offset, hid_t member) {
    if (H5Tinsert(compound, name, offset, member) < 0) fail(name);
    H5Tclose(member);
}

#pragma pack(push, 1)
typedef struct { /* /index row: 480 bytes */
    int64_t seq; int32_t step; char segment[16]; int32_t layer; char name[64];
    int32_t occurrence; char dtype[16]; int32_t ndim; int64_t shape[8]; char path[64];
    char kernel_id[64]; char contract_id[64]; char effective_contract_id[64];
    int64_t t_start_ns, t_end_ns, position, offset, nbytes;
} index_row;

typedef struct { /* /dispatch row: 164 bytes */
    int64_t index_seq; int32_t call, batch, kv_group, head_start, head_count, q_heads, kv_heads,
        q_rows, kv_len, head_dim, v_head_dim;
    char mask_kind[16]; char dtype[16]; char primitive[32]; char metal_primitive[32];
    int64_t t_start_ns, t_end_ns;
} dispatch_row;

typedef struct { /* /tokens row: 29 bytes */
    int32_t step; char segment[16]; int64_t token_id; int8_t is_stop;
} token_row;
#pragma pack(pop)

static hid_t index_type(void) {
    hsize_t eight = 8;
    hid_t t = check(H5Tcreate(H5T_COMPOUND, sizeof(index_row)), "H5Tcreate");
    H5Tinsert(t, "seq", 0, H5T_STD_I64LE);
    H5Tinsert(t, "step", 8, H5T_STD_I32LE);
    insert_owned(t, "segment", 12, str_type(16));
    H5Tinsert(t, "layer", 28, H5T_STD_I32LE);
    insert_owned(t, "name", 32, str_type(64));
    H5Tinsert(t, "occurrence", 96, H5T_STD_I32LE);
    insert_owned(t, "dtype", 100, str_type(16));
    H5Tinsert(t, "ndim", 116, H5T_STD_I32LE);
    insert_owned(t, "shape", 120, H5Tarray_create2(H5T_STD_I64LE, 1, &eight));
    insert_owned(t, "path", 184, str_type(64));
    insert_owned(t, "kernel_id", 248, str_type(64));
    insert_owned(t, "contract_id", 312, str_type(64));
    insert_owned(t, "effective_contract_id", 376, str_type(64));
    H5Tinsert(t, "t_start_ns", 440, H5T_STD_I64LE);
    H5Tinsert(t, "t_end_ns", 448, H5T_STD_I64LE);
    H5Tinsert(t, "position", 456, H5T_STD_I64LE);
    H5Tinsert(t, "offset", 464, H5T_STD_I64LE);
    H5Tinsert(t, "nbytes", 472, H5T_STD_I64LE);
    return t;
}

static hid_t dispatch_type(void) {
    static const char *ints[] = {"call", "batch", "kv_group", "head_start", "head_count", "q_heads",
                                 "kv_heads", "q_rows", "kv_len", "head_dim", "v_head_dim"};
    hid_t t = check(H5Tcreate(H5T_COMPOUND, sizeof(dispatch_row)), "H5Tcreate");
    H5Tinsert(t, "index_seq", 0, H5T_STD_I64LE);
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) H5Tinsert(t, ints[i], 8 + 4 * i, H5T_STD_I32LE);
    insert_owned(t, "mask_kind", 52, str_type(16));
    insert_owned(t, "dtype", 68, str_type(16));
    insert_owned(t, "primitive", 84, str_type(32));
    insert_owned(t, "metal_primitive", 116, str_type(32));
    H5Tinsert(t, "t_start_ns", 148, H5T_STD_I64LE);
    H5Tinsert(t, "t_end_ns", 156, H5T_STD_I64LE);
    return t;
}

static hid_t tokens_type(void) {
    hid_t t = check(H5Tcreate(H5T_COMPOUND, sizeof(token_row)), "H5Tcreate");
    H5Tinsert(t, "step", 0, H5T_STD_I32LE);
    insert_owned(t, "segment", 4, str_type(16));
    H5Tinsert(t, "token_id", 20, H5T_STD_I64LE);
    H5Tinsert(t, "is_stop", 28, H5T_STD_I8LE);
    return t;
}

static hid_t create_table(hid_t file, const char *path, hid_t type) {
    hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = 1024;
    hid_t space = H5Screate_simple(1, &zero, &unlimited);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    hid_t ds = check(H5Dcreate2(file, path, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), path);
    int_attr(ds, "committed_rows", H5T_STD_I64LE, 0);
    H5Pclose(dcpl);
    H5Sclose(space);
    return ds;
}

static hsize_t table_rows(hid_t ds) {
    hsize_t rows;
    hid_t space = H5Dget_space(ds);
    H5Sget_simple_extent_dims(space, &rows, NULL);
    H5Sclose(space);
    return rows;
}

/* Append n rows past the current end (which is past committed_rows, so no reader looks there yet). */
static void append_rows(hid_t ds, hid_t type, const void *rows, hsize_t n) {
    hsize_t start = table_rows(ds), total = start + n;
    if (n == 0) return;
    if (H5Dset_extent(ds, &total) < 0) fail("H5Dset_extent");
    hid_t space = H5Dget_space(ds);
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &n, NULL);
    hid_t mem = H5Screate_simple(1, &n, NULL);
    if (H5Dwrite(ds, type, mem, space, H5P_DEFAULT, rows) < 0) fail("H5Dwrite (rows)");
    H5Sclose(mem);
    H5Sclose(space);
}

/* One pack: the step's tensors' bytes, back to back, as a 1-D H5T_STD_U8LE dataset written whole,
 * once, in the step's group (contiguous: each tensor is then one run of the file). */
static void write_pack(hid_t group, const char *name, const unsigned char *bytes, hsize_t n) {
    hid_t space = H5Screate_simple(1, &n, NULL);
    hid_t ds = check(H5Dcreate2(group, name, H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
    if (H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes) < 0) fail("H5Dwrite (pack)");
    H5Dclose(ds);
    H5Sclose(space);
}

/* Appends a tensor's stored bytes to the pack buffer; returns its offset there. The format's
 * bytes are little-endian: on a little-endian host, the values as they lie in memory. */
static int64_t pack_bytes(unsigned char *pack, size_t *filled, const void *data, size_t n) {
    int64_t offset = (int64_t)*filled;
    memcpy(pack + *filled, data, n);
    *filled += n;
    return offset;
}

static index_row row_for(int64_t seq, int32_t step, const char *name, int32_t layer, const char *dtype,
                         int ndim, const hsize_t *dims, const char *path, int64_t offset, int64_t nbytes) {
    index_row r;
    memset(&r, 0, sizeof r);
    r.seq = seq;
    r.step = step;
    strncpy(r.segment, step == 0 ? "prefill" : "decode", sizeof r.segment);
    r.layer = layer;
    strncpy(r.name, name, sizeof r.name);
    strncpy(r.dtype, dtype, sizeof r.dtype);
    r.ndim = ndim;
    for (int i = 0; i < ndim; i++) r.shape[i] = (int64_t)dims[i];
    strncpy(r.path, path, sizeof r.path);
    r.t_start_ns = r.t_end_ns = seq * 1000;
    r.position = -1; /* unknown: alignment derives positions from segment order */
    r.offset = offset;
    r.nbytes = nbytes;
    return r;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: write_capture OUT.h5\n");
        return 2;
    }
    char partial[4096];
    if (snprintf(partial, sizeof partial, "%s.partial", argv[1]) >= (int)sizeof partial) fail("path length");

    /* 1. Everything a reader needs before the first step, under a temporary name. The 1.8 file
     *    format: its object headers hold attributes over 64 KiB (a long prompt), and its
     *    superblock (version 2) has no "open for writing" flag. Locking off, so a viewer reading
     *    the file never blocks us. */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
#if H5_VERSION_GE(1, 10, 2)
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
#else
    H5Pset_libver_bounds(fapl, H5F_LIBVER_18, H5F_LIBVER_LATEST);
#endif
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
    H5Pset_file_locking(fapl, 0, 1); /* older versions: HDF5_USE_FILE_LOCKING=FALSE in the environment */
#endif
    hid_t file = check(H5Fcreate(partial, H5F_ACC_TRUNC, H5P_DEFAULT, fapl), "H5Fcreate");
    char *prompt = malloc(PROMPT_BYTES + 1);
    if (prompt == NULL) fail("malloc");
    for (int i = 0; i < PROMPT_BYTES; i++) prompt[i] = "the quick brown fox "[i % 20];
    prompt[PROMPT_BYTES] = '\0';
    str_attr(file, "format", "parity-xray-capture");
    int_attr(file, "format_version", H5T_STD_I64LE, 1);
    str_attr(file, "role", "native");
    str_attr(file, "engine_name", "c-writer");
    str_attr(file, "engine_version", "1");
    str_attr(file, "engine_commit", "");
    str_attr(file, "model_id", "toy");
    str_attr(file, "weights_hash", "sha256:00");
    str_attr(file, "device", "cpu");
    str_attr(file, "compiler", "cc");
    str_attr(file, "created_utc", "2026-07-15T10:02:03+00:00");
    str_attr(file, "prompt", prompt);
    free(prompt);
    int_attr(file, "seed", H5T_STD_I64LE, 0);
    {
        const char *json = "{\"writer\": \"docs/examples/write_capture.c\"}";
        hsize_t n = strlen(json);
        hid_t s = H5Screate_simple(1, &n, NULL);
        hid_t a = check(H5Acreate2(file, "provenance_json", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT), "provenance_json");
        H5Awrite(a, H5T_NATIVE_UINT8, json);
        H5Aclose(a);
        H5Sclose(s);
    }
    int_attr(file, "complete", H5T_STD_I8LE, 0);

    hid_t itype = index_type(), dtype = dispatch_type(), ttype = tokens_type();
    hid_t tensors = check(H5Gcreate2(file, "/tensors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "/tensors");
    hid_t blocks[32];
    for (int b = 0; b < 32; b++) {
        char name[8];
        snprintf(name, sizeof name, "b%02d", b);
        blocks[b] = check(H5Gcreate2(tensors, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
    }
    hid_t index = create_table(file, "/index", itype);
    hid_t dispatch = create_table(file, "/dispatch", dtype);
    hid_t tokens = create_table(file, "/tokens", ttype);
    H5Fflush(file, H5F_SCOPE_GLOBAL);

    int64_t seq = 0;
    for (int32_t step = 0; step < STEPS; step++) {
        /* 2. This step's group (block J holds steps 2^J-1 .. 2^(J+1)-2, all created with the block). */
        int block = 0;
        while ((2u << block) - 1 <= (unsigned)step) block++;
        if ((unsigned)step == (1u << block) - 1) {
            for (unsigned g = (1u << block) - 1; g < (2u << block) - 1; g++) {
                char name[32];
                snprintf(name, sizeof name, "s%07u", g);
                H5Gclose(check(H5Gcreate2(blocks[block], name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name));
            }
        }
        char group_name[32];
        snprintf(group_name, sizeof group_name, "s%07d", step);
        hid_t group = check(H5Gopen2(blocks[block], group_name, H5P_DEFAULT), group_name);

        index_row rows[3];
        char pack_name[32], path[128]; /* a pack path fits the index field's 64 bytes */
        uint16_t bf16[ROWS * COLS], half[ROWS * COLS];
        float logits[VOCAB];
        unsigned char pack[sizeof bf16 + sizeof half + sizeof logits];
        size_t filled = 0;
        for (int i = 0; i < ROWS * COLS; i++) {
            bf16[i] = (uint16_t)(0x3f80 + 7 * i + step);   /* bfloat16 bits */
            half[i] = (uint16_t)(0x3c00 + 3 * i + step);   /* float16 bits, written as they are */
        }
        for (int i = 0; i < VOCAB; i++) logits[i] = (float)(i - step) / 8.0f;
        hsize_t matrix[2] = {ROWS, COLS}, vector[2] = {1, VOCAB};

        /* The pack is named after its first tensor's seq; every row of the step points at it. */
        snprintf(pack_name, sizeof pack_name, "p%08lld", (long long)seq);
        snprintf(path, sizeof path, "/tensors/b%02d/%s/%s", block, group_name, pack_name);
        int64_t at = pack_bytes(pack, &filled, bf16, sizeof bf16);
        rows[0] = row_for(seq++, step, "l_out-0", 0, "bfloat16", 2, matrix, path, at, sizeof bf16);
        at = pack_bytes(pack, &filled, half, sizeof half);
        rows[1] = row_for(seq++, step, "kqv_out-0", 0, "float16", 2, matrix, path, at, sizeof half);
        at = pack_bytes(pack, &filled, logits, sizeof logits);
        rows[2] = row_for(seq++, step, "result_output", -1, "float32", 2, vector, path, at, sizeof logits);
        write_pack(group, pack_name, pack, filled);
        H5Gclose(group);

        dispatch_row call;
        memset(&call, 0, sizeof call);
        call.index_seq = rows[1].seq;
        call.batch = 1;
        call.kv_group = -1;
        call.head_count = call.q_heads = 4;
        call.kv_heads = 1;
        call.q_rows = 1;
        call.kv_len = 3 + step;
        call.head_dim = call.v_head_dim = 16;
        strncpy(call.mask_kind, "none", sizeof call.mask_kind);
        strncpy(call.dtype, "float16", sizeof call.dtype);
        strncpy(call.primitive, "fallback", sizeof call.primitive);
        token_row token;
        memset(&token, 0, sizeof token);
        token.step = step;
        strncpy(token.segment, step == 0 ? "prefill" : "decode", sizeof token.segment);
        token.token_id = 100 + step;
        token.is_stop = step == STEPS - 1;

        /* 3. Append all three tables' rows past committed_rows and flush; then commit /index and
         *    flush; then commit /dispatch and /tokens together and flush. */
        append_rows(index, itype, rows, 3);
        append_rows(dispatch, dtype, &call, 1);
        append_rows(tokens, ttype, &token, 1);
        H5Fflush(file, H5F_SCOPE_GLOBAL);
        set_int_attr(index, "committed_rows", (int64_t)table_rows(index));
        H5Fflush(file, H5F_SCOPE_GLOBAL);
        set_int_attr(dispatch, "committed_rows", (int64_t)table_rows(dispatch));
        set_int_attr(tokens, "committed_rows", (int64_t)table_rows(tokens));
        H5Fflush(file, H5F_SCOPE_GLOBAL);
        /* After the first step's commits, the file takes its name: a capture already there is
         * replaced only by one with a step to show. POSIX renames the open file; on Windows
         * close it, rename it, and open it again. */
        if (step == 0 && rename(partial, argv[1]) != 0) fail("rename");
    }

    /* 4. The complete marker, written last, in place. */
    set_int_attr(file, "complete", 1);
    H5Tclose(itype);
    H5Tclose(dtype);
    H5Tclose(ttype);
    H5Dclose(index);
    H5Dclose(dispatch);
    H5Dclose(tokens);
    for (int b = 0; b < 32; b++) H5Gclose(blocks[b]);
    H5Gclose(tensors);
    H5Pclose(fapl);
    if (H5Fclose(file) < 0) fail("H5Fclose");
    return 0;
}
