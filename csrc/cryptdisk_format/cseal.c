/* cryptdisk.format._cseal: the segment loops of sealed files, without the GIL.
 *
 * A sealed file's segment i of n is AES-GCM(DEK, nonce_i, plaintext_i, ad="") with
 * nonce_i = 0x000000 || u64be(i) || (1 if i == n-1 else 0) (src/cryptdisk/format/_sealed.py).
 * A database scan decrypts thousands of 64 KiB segments; through cryptography that is one
 * Python call per segment, with the GIL held. Here one call decrypts (or encrypts) a run of
 * consecutive segments with the GIL released, so the scan's threads run in parallel.
 *
 * No primitive is implemented: AES-GCM comes from Intel's multi-buffer library
 * (intel-ipsec-mb), whose IMB_AES{128,256}_GCM_{ENC,DEC} run on a key's precomputed data
 * (the AES key schedule and the GHASH key's powers, made once per Key) on the code path
 * init_mb_mgr_auto picks for this CPU. The decryption returns the tag it computes; it is
 * compared with the stored one in constant time, and a segment that fails is wiped before
 * the call returns its index: no unauthenticated plaintext is left in the output.
 *
 * Reading: decrypt_run and decrypt_spans take the ciphertext as a buffer; pread_run and
 * pread_spans read it themselves from a file descriptor, a few records at a time into a
 * buffer of the calling OS thread (it stays in the CPU's cache between the read and the
 * decryption), without the GIL. A file is never memory-mapped here: a mapping of a file
 * another process truncates raises SIGBUS on the next read past its new end, which ends the
 * process; pread returns short instead, and the first segment the file no longer holds
 * whole is reported as one that fails to authenticate.
 *
 * Thread safety: the manager is made at import and only its function table is read
 * afterwards (the GCM calls keep no state in it); each call has its GCM context on its stack;
 * a Key is read-only after it is made. A forked child inherits the manager as plain memory.
 * Key data is wiped (imb_clear_mem) when a Key is freed; a Key refuses to be pickled or
 * copied, and its repr names the cipher only. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <intel-ipsec-mb.h>

#define TAG 16
#define NONCE 12

static IMB_MGR *imb;
static IMB_ARCH imb_arch;

typedef struct {
    PyObject_HEAD
    struct gcm_key_data *kd; /* 64-byte aligned, its own allocation */
    int aes256;
} Key;

static void nonce_of(uint8_t iv[NONCE], uint64_t index, int last) {
    iv[0] = iv[1] = iv[2] = 0;
    for (int b = 0; b < 8; b++)
        iv[3 + b] = (uint8_t)(index >> (56 - 8 * b));
    iv[11] = (uint8_t)(last ? 1 : 0);
}

/* 1 when the two tags are equal, in constant time: the halves' differences ORed, one test */
static int tag_equal(const uint8_t *a, const uint8_t *b) {
    uint64_t x[2], y[2];
    memcpy(x, a, TAG);
    memcpy(y, b, TAG);
    volatile uint64_t diff = (x[0] ^ y[0]) | (x[1] ^ y[1]);
    return diff == 0;
}

/* -- Key ------------------------------------------------------------------------------ */

static PyObject *Key_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"key", NULL};
    Py_buffer key;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*:Key", kwlist, &key))
        return NULL;
    if (key.len != 16 && key.len != 32) {
        PyBuffer_Release(&key);
        PyErr_Format(PyExc_ValueError, "AES-GCM keys are 16 or 32 bytes, not %zd", key.len);
        return NULL;
    }
    Key *self = (Key *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&key);
        return NULL;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(struct gcm_key_data)) != 0) {
        PyBuffer_Release(&key);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->kd = p;
    self->aes256 = key.len == 32;
    if (self->aes256)
        IMB_AES256_GCM_PRE(imb, key.buf, self->kd);
    else
        IMB_AES128_GCM_PRE(imb, key.buf, self->kd);
    PyBuffer_Release(&key);
    return (PyObject *)self;
}

static void Key_dealloc(Key *self) {
    if (self->kd != NULL) {
        imb_clear_mem(self->kd, sizeof *self->kd);
        free(self->kd);
        self->kd = NULL;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Key_repr(Key *self) {
    return PyUnicode_FromFormat("<cryptdisk.format._cseal.Key AES-%d-GCM>", self->aes256 ? 256 : 128);
}

static PyObject *Key_reduce(PyObject *self, PyObject *args) {
    PyErr_SetString(PyExc_TypeError, "a cryptdisk.format._cseal.Key holds key material and cannot be "
                                     "pickled or copied");
    return NULL;
}

/* The buffers of a run, checked: ``cipher`` holds the records of segments first..last
 * (each its plaintext then its 16-byte tag), ``plain`` their plaintexts; every segment but
 * the file's final one (index ``final``) holds ``segment_size`` bytes, the final one
 * ``final_size``. Returns the run's plaintext size, or -1 with an exception. */
static Py_ssize_t run_layout(long long first, long long last, long long final,
                             Py_ssize_t segment_size, Py_ssize_t final_size, Py_ssize_t cipher_len,
                             Py_ssize_t plain_len) {
    if (segment_size <= 0 || final_size < 0 || final_size >= segment_size) {
        PyErr_Format(PyExc_ValueError, "bad segment sizes: segment_size %zd, final_size %zd",
                     segment_size, final_size);
        return -1;
    }
    if (first < 0 || first > last || last > final) {
        PyErr_Format(PyExc_ValueError, "bad segment range: first %lld, last %lld, final %lld", first, last,
                     final);
        return -1;
    }
    unsigned long long count = last - first + 1;
    unsigned long long whole = count - (last == final ? 1 : 0);
    /* the sizes fit in a Py_ssize_t, or the buffers cannot be that long */
    if (count > (unsigned long long)PY_SSIZE_T_MAX / (unsigned long long)(segment_size + TAG)) {
        PyErr_SetString(PyExc_ValueError, "segment run too long for its buffers");
        return -1;
    }
    Py_ssize_t plain = (Py_ssize_t)whole * segment_size + (last == final ? final_size : 0);
    Py_ssize_t cipher = plain + (Py_ssize_t)count * TAG;
    if (cipher_len != cipher || plain_len != plain) {
        PyErr_Format(PyExc_ValueError,
                     "segments %lld..%lld need a %zd-byte ciphertext and a %zd-byte plaintext buffer, "
                     "not %zd and %zd bytes",
                     first, last, cipher, plain, cipher_len, plain_len);
        return -1;
    }
    return plain;
}

static int segment_size_ok(Py_ssize_t segment_size, Py_ssize_t final_size) {
    if (segment_size <= 0 || final_size < 0 || final_size >= segment_size) {
        PyErr_Format(PyExc_ValueError, "bad segment sizes: segment_size %zd, final_size %zd",
                     segment_size, final_size);
        return -1;
    }
    return 0;
}

static int overlap(const Py_buffer *a, const Py_buffer *b) {
    uintptr_t a0 = (uintptr_t)a->buf, b0 = (uintptr_t)b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + (uintptr_t)b->len && b0 < a0 + (uintptr_t)a->len;
}

/* Decrypt the ``n``-byte ciphertext of ``record`` (the ciphertext then its 16-byte tag)
 * under ``iv`` into ``pt``: 1 when the tag the decryption computes matches the record's
 * (compared in constant time), else 0, and then the caller wipes ``pt``. Without the GIL. */
static inline int open_record(const Key *self, struct gcm_context_data *ctx, uint8_t *pt,
                              const uint8_t *record, size_t n, const uint8_t *iv) {
    uint8_t tag[TAG];
    memcpy(tag, record + n, TAG);
    tag[0] ^= 0xff; /* a call that wrote no tag cannot match */
    if (self->aes256)
        IMB_AES256_GCM_DEC(imb, self->kd, ctx, pt, record, n, iv, NULL, 0, tag, TAG);
    else
        IMB_AES128_GCM_DEC(imb, self->kd, ctx, pt, record, n, iv, NULL, 0, tag, TAG);
    return tag_equal(tag, record + n);
}

/* :func:`open_record` of segment ``i`` of a sealed file whose last segment is ``final``
 * (its nonce made from both). */
static inline int open_segment(const Key *self, struct gcm_context_data *ctx, uint8_t *pt,
                               const uint8_t *record, size_t n, long long i, long long final) {
    uint8_t iv[NONCE];
    nonce_of(iv, (uint64_t)i, i == final);
    return open_record(self, ctx, pt, record, n, iv);
}

/* -- where a run's records come from ---------------------------------------------------- */

/* pread_run and pread_spans read this many bytes of records at a time (at least one record) */
#define READ_CHUNK (1024 * 1024)

static pthread_key_t chunk_key;
static pthread_once_t chunk_once = PTHREAD_ONCE_INIT;

static void chunk_free(void *p) { free(p); }
static void chunk_key_make(void) { (void)pthread_key_create(&chunk_key, chunk_free); }

typedef struct {
    size_t cap;
    uint8_t data[];
} Chunk;

/* The calling OS thread's read buffer, at least ``n`` bytes (kept for the thread's life:
 * freed when it exits), or NULL. Without the GIL. */
static uint8_t *thread_chunk(size_t n) {
    (void)pthread_once(&chunk_once, chunk_key_make);
    Chunk *c = pthread_getspecific(chunk_key);
    if (c == NULL || c->cap < n) {
        Chunk *grown = malloc(sizeof(Chunk) + n);
        if (grown == NULL)
            return NULL;
        grown->cap = n;
        free(c);
        c = grown;
        if (pthread_setspecific(chunk_key, c) != 0) {
            free(c);
            return NULL;
        }
    }
    return c->data;
}

/* The records of segments first..last: in memory (``mem``), or in file ``fd`` from offset
 * ``pos``, read a chunk at a time. */
typedef struct {
    const uint8_t *mem;
    int fd;
    long long pos, first, last, final;
    size_t seg, final_size;
    uint8_t *buf;       /* fd: the thread's chunk */
    size_t cap;         /* its size */
    long long lo, hi;   /* fd: the records of segments lo..hi-1 are in buf */
    int err;            /* fd: errno of a failed read, else 0 */
} Records;

static size_t record_len(const Records *r, long long i) {
    return (i < r->final ? r->seg : r->final_size) + TAG;
}

/* Segment ``i``'s record (first <= i <= last, called in increasing order), or NULL when the
 * file ends before its end (short) or the read failed (``err`` set). Without the GIL. */
static const uint8_t *record_at(Records *r, long long i) {
    size_t whole = r->seg + TAG;
    if (r->mem != NULL)
        return r->mem + (size_t)(i - r->first) * whole;
    if (i >= r->lo && i < r->hi)
        return r->buf + (size_t)(i - r->lo) * whole;
    long long n = (long long)(r->cap / whole);
    if (n < 1)
        n = 1;
    if (n > r->last - i + 1)
        n = r->last - i + 1;
    size_t want = (size_t)(n - 1) * whole + record_len(r, i + n - 1);
    size_t got = 0;
    off_t at = (off_t)(r->pos + (i - r->first) * (long long)whole);
    while (got < want) {
        ssize_t k = pread(r->fd, r->buf + got, want - got, at + (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            r->err = errno ? errno : EIO;
            return NULL;
        }
        if (k == 0)
            break; /* the file ends here */
        got += (size_t)k;
    }
    long long complete = got == want ? n : (long long)(got / whole);
    if (complete < 1)
        return NULL;
    r->lo = i;
    r->hi = i + complete;
    return r->buf;
}

/* Records from ``fd`` at ``pos``: its chunk taken (ENOMEM in ``err`` if none). Without the GIL. */
static void records_from_fd(Records *r, int fd, long long pos) {
    size_t need = r->seg + TAG > READ_CHUNK ? r->seg + TAG : READ_CHUNK;
    r->mem = NULL;
    r->fd = fd;
    r->pos = pos;
    r->lo = r->hi = 0;
    r->err = 0;
    r->cap = need;
    r->buf = thread_chunk(need);
    if (r->buf == NULL)
        r->err = ENOMEM;
}

/* Segments first..last from ``r`` into ``pt`` (decrypt_run's loop): -1, or the first that
 * fails to authenticate or that the file does not hold (its output wiped). Without the GIL. */
static long long open_run(const Key *self, Records *r, uint8_t *pt) {
    struct gcm_context_data ctx;
    long long failed = -1;
    for (long long i = r->first; i <= r->last; i++) {
        size_t n = i < r->final ? r->seg : r->final_size;
        const uint8_t *ct = record_at(r, i);
        if (ct == NULL || !open_segment(self, &ctx, pt, ct, n, i, r->final)) {
            imb_clear_mem(pt, n); /* unauthenticated plaintext: never released */
            failed = i;
            break;
        }
        pt += n;
    }
    imb_clear_mem(&ctx, sizeof ctx);
    return failed;
}

static const char RUN_DOC[] =
    "decrypt_run(cipher, out, first, last, final, segment_size, final_size) -> int\n\n"
    "Decrypt and authenticate segments first..last of a sealed file, without the GIL.\n"
    "``cipher`` holds their records (plaintext then 16-byte tag each), ``out`` (writable)\n"
    "receives their plaintexts; both must be exactly as long as the layout says (ValueError\n"
    "otherwise). ``final`` is the index of the file's last segment, ``final_size`` its\n"
    "plaintext size; every other segment holds ``segment_size`` bytes. Returns -1 when every\n"
    "segment authenticates, else the index of the first that does not: its output is wiped\n"
    "and the segments after it are not written.";

static PyObject *Key_decrypt_run(Key *self, PyObject *args) {
    Py_buffer cipher, out;
    long long first, last, final;
    Py_ssize_t seg, final_size;
    if (!PyArg_ParseTuple(args, "y*w*LLLnn:decrypt_run", &cipher, &out, &first, &last, &final, &seg,
                          &final_size))
        return NULL;
    long long failed = -1;
    if (run_layout(first, last, final, seg, final_size, cipher.len, out.len) < 0)
        goto done;
    if (overlap(&cipher, &out)) {
        PyErr_SetString(PyExc_ValueError, "decrypt_run: the ciphertext and output buffers overlap");
        goto done;
    }
    Records r = {.mem = cipher.buf, .first = first, .last = last, .final = final,
                 .seg = (size_t)seg, .final_size = (size_t)final_size};
    Py_BEGIN_ALLOW_THREADS
    failed = open_run(self, &r, out.buf);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&cipher);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(failed);
}

static const char PREAD_RUN_DOC[] =
    "pread_run(fd, pos, out, first, last, final, segment_size, final_size) -> int\n\n"
    "decrypt_run with the records read from file descriptor ``fd`` at offset ``pos`` (pread, a\n"
    "chunk at a time, without the GIL) instead of a buffer. A segment the file no longer\n"
    "holds whole (truncated) counts as one that does not authenticate; a failed read\n"
    "raises OSError.";

static PyObject *Key_pread_run(Key *self, PyObject *args) {
    Py_buffer out;
    int fd;
    long long pos, first, last, final;
    Py_ssize_t seg, final_size;
    if (!PyArg_ParseTuple(args, "iLw*LLLnn:pread_run", &fd, &pos, &out, &first, &last, &final, &seg,
                          &final_size))
        return NULL;
    long long failed = -1;
    /* the ciphertext's length the layout needs, if ``out`` is as long as it says */
    Py_ssize_t cipher_len = first >= 0 && first <= last && last - first < PY_SSIZE_T_MAX / (4 * TAG)
                                ? out.len + (Py_ssize_t)(last - first + 1) * TAG
                                : -1;
    if (run_layout(first, last, final, seg, final_size, cipher_len, out.len) < 0)
        goto done;
    if (pos < 0 || fd < 0) {
        PyErr_Format(PyExc_ValueError, "pread_run: bad file descriptor %d or offset %lld", fd, pos);
        goto done;
    }
    Records r = {.first = first, .last = last, .final = final, .seg = (size_t)seg,
                 .final_size = (size_t)final_size};
    Py_BEGIN_ALLOW_THREADS
    records_from_fd(&r, fd, pos);
    if (r.err == 0) {
        failed = open_run(self, &r, out.buf);
        if (r.err != 0)
            imb_clear_mem(out.buf, (size_t)out.len);
    }
    Py_END_ALLOW_THREADS
    if (r.err != 0) {
        errno = r.err;
        PyErr_SetFromErrno(r.err == ENOMEM ? PyExc_MemoryError : PyExc_OSError);
    }
done:
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(failed);
}

static const char SPANS_DOC[] =
    "decrypt_spans(cipher, out, first, last, final, segment_size, final_size, offset, spans)\n"
    "-> (int, int)\n\n"
    "Plaintext ``[offset, offset + len(out))`` of a sealed file, lying in segments\n"
    "first..last (``cipher`` holds their records, as for decrypt_run), decrypted and\n"
    "authenticated into ``out`` and then packed: ``spans`` is a sequence of ``(a, b)``\n"
    "plaintext offsets, in order, not overlapping, inside that range; their bytes are\n"
    "moved together to the start of ``out``. One call, the GIL released once: a segment\n"
    "only partly inside the range is decrypted whole into a scratch buffer (and\n"
    "authenticated) and its part copied. Returns ``(-1, packed bytes)`` when every segment\n"
    "authenticates, else ``(index of the first that does not, 0)``: then all of ``out``\n"
    "is wiped. ValueError for buffers or spans that do not fit the layout.";

/* decrypt_spans and pread_spans: ``r`` holds (or reads) the records, ``cipher_len`` their
 * length in memory (-1 from a file: then the layout is checked on ``out`` alone). */
static PyObject *spans_impl(Key *self, Records *r, Py_ssize_t cipher_len, Py_buffer *outp,
                            long long first, long long last, long long final, Py_ssize_t seg,
                            Py_ssize_t final_size, long long offset, PyObject *spans_obj) {
    Py_buffer out = *outp;
    long long failed = -1;
    Py_ssize_t packed = 0, count = 0;
    Py_ssize_t *spans = NULL;
    uint8_t *scratch = NULL;
    PyObject *fast = NULL;
    if (segment_size_ok(seg, final_size) < 0)
        goto done;
    {
        if (first < 0 || first > last || last > final) {
            PyErr_Format(PyExc_ValueError, "bad segment range: first %lld, last %lld, final %lld", first,
                         last, final);
            goto done;
        }
        unsigned long long nseg = last - first + 1;
        if (nseg > (unsigned long long)PY_SSIZE_T_MAX / (unsigned long long)(seg + TAG)) {
            PyErr_SetString(PyExc_ValueError, "segment run too long for its buffers");
            goto done;
        }
        Py_ssize_t whole = (Py_ssize_t)nseg - (last == final ? 1 : 0);
        Py_ssize_t plain = whole * seg + (last == final ? final_size : 0);
        Py_ssize_t need = plain + (Py_ssize_t)nseg * TAG;
        long long base = first * (long long)seg;
        if ((cipher_len >= 0 && cipher_len != need) || offset < base || out.len <= 0
            || offset - base + (long long)out.len > (long long)plain) {
            PyErr_Format(PyExc_ValueError,
                         "decrypt_spans: segments %lld..%lld (a %zd-byte ciphertext) do not "
                         "hold the %zd bytes at offset %lld",
                         first, last, need, out.len, offset);
            goto done;
        }
    }
    fast = PySequence_Fast(spans_obj, "decrypt_spans: spans must be a sequence of (start, end) pairs");
    if (fast == NULL)
        goto done;
    count = PySequence_Fast_GET_SIZE(fast);
    spans = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(count ? count : 1));
    if (spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    {
        long long prev = offset, end = offset + (long long)out.len;
        for (Py_ssize_t k = 0; k < count; k++) {
            long long a, b;
            PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
            if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "LL", &a, &b)) {
                if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyErr_SetString(PyExc_ValueError, "decrypt_spans: each span is a (start, end) tuple");
                }
                goto done;
            }
            if (a < prev || b < a || b > end) {
                PyErr_Format(PyExc_ValueError,
                             "decrypt_spans: span %zd (%lld, %lld) is not in order inside [%lld, %lld)", k,
                             a, b, offset, end);
                goto done;
            }
            spans[2 * k] = (Py_ssize_t)(a - offset);
            spans[2 * k + 1] = (Py_ssize_t)(b - offset);
            prev = b;
        }
    }
    scratch = PyMem_RawMalloc((size_t)seg);
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    struct gcm_context_data ctx;
    uint8_t *dst = out.buf;
    long long lo = offset, hi = offset + (long long)out.len; /* the range wanted */
    int used = 0;
    if (r->mem == NULL && r->buf == NULL)
        failed = first; /* (no read buffer: err says why) */
    for (long long i = first; failed < 0 && i <= last; i++) {
        size_t n = i < final ? (size_t)seg : (size_t)final_size;
        long long s0 = i * (long long)seg, s1 = s0 + (long long)n;
        /* a segment wholly inside the range goes straight to its place */
        int inside = s0 >= lo && s1 <= hi;
        uint8_t *pt = inside ? dst + (s0 - lo) : scratch;
        const uint8_t *ct = record_at(r, i);
        int ok = ct != NULL && open_segment(self, &ctx, pt, ct, n, i, final);
        if (!inside)
            used = 1;
        if (!ok) {
            failed = (long long)i;
            break;
        }
        if (!inside) { /* its part inside the range, once authenticated */
            long long a = s0 > lo ? s0 : lo, b = s1 < hi ? s1 : hi;
            if (b > a)
                memcpy(dst + (a - lo), scratch + (a - s0), (size_t)(b - a));
        }
    }
    if (failed >= 0) {
        imb_clear_mem(dst, (size_t)out.len); /* unauthenticated plaintext: never released */
    } else {
        for (Py_ssize_t k = 0; k < count; k++) {
            Py_ssize_t a = spans[2 * k], len = spans[2 * k + 1] - a;
            if (a != packed)
                memmove(dst + packed, dst + a, (size_t)len);
            packed += len;
        }
    }
    if (used)
        imb_clear_mem(scratch, (size_t)seg);
    imb_clear_mem(&ctx, sizeof ctx);
    Py_END_ALLOW_THREADS
    if (r->err != 0) {
        errno = r->err;
        PyErr_SetFromErrno(r->err == ENOMEM ? PyExc_MemoryError : PyExc_OSError);
    }
done:
    PyMem_RawFree(scratch);
    PyMem_Free(spans);
    Py_XDECREF(fast);
    if (PyErr_Occurred())
        return NULL;
    return Py_BuildValue("Ln", failed, failed >= 0 ? (Py_ssize_t)0 : packed);
}

static PyObject *Key_decrypt_spans(Key *self, PyObject *args) {
    Py_buffer cipher, out;
    long long first, last, final, offset;
    Py_ssize_t seg, final_size;
    PyObject *spans_obj, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*w*LLLnnLO:decrypt_spans", &cipher, &out, &first, &last, &final,
                          &seg, &final_size, &offset, &spans_obj))
        return NULL;
    if (overlap(&cipher, &out)) {
        PyErr_SetString(PyExc_ValueError, "decrypt_spans: the ciphertext and output buffers overlap");
    } else {
        Records r = {.mem = cipher.buf, .first = first, .last = last, .final = final,
                     .seg = (size_t)seg, .final_size = (size_t)final_size};
        result = spans_impl(self, &r, cipher.len, &out, first, last, final, seg, final_size, offset,
                            spans_obj);
    }
    PyBuffer_Release(&cipher);
    PyBuffer_Release(&out);
    return result;
}

static const char PREAD_SPANS_DOC[] =
    "pread_spans(fd, pos, out, first, last, final, segment_size, final_size, offset, spans)\n"
    "-> (int, int)\n\n"
    "decrypt_spans with the records read from file descriptor ``fd`` at offset ``pos`` (pread,\n"
    "a chunk at a time, without the GIL) instead of a buffer. A segment the file no longer\n"
    "holds whole (truncated) counts as one that does not authenticate; a failed read raises\n"
    "OSError.";

static PyObject *Key_pread_spans(Key *self, PyObject *args) {
    Py_buffer out;
    int fd;
    long long pos, first, last, final, offset;
    Py_ssize_t seg, final_size;
    PyObject *spans_obj, *result = NULL;
    if (!PyArg_ParseTuple(args, "iLw*LLLnnLO:pread_spans", &fd, &pos, &out, &first, &last, &final,
                          &seg, &final_size, &offset, &spans_obj))
        return NULL;
    if (pos < 0 || fd < 0 || seg <= 0) {
        PyErr_Format(PyExc_ValueError, "pread_spans: bad file descriptor %d, offset %lld or segment "
                     "size %zd", fd, pos, seg);
    } else {
        Records r = {.first = first, .last = last, .final = final, .seg = (size_t)seg,
                     .final_size = (size_t)final_size};
        Py_BEGIN_ALLOW_THREADS
        records_from_fd(&r, fd, pos);
        Py_END_ALLOW_THREADS
        result = spans_impl(self, &r, -1, &out, first, last, final, seg, final_size, offset,
                            spans_obj);
    }
    PyBuffer_Release(&out);
    return result;
}

static const char ONE_DOC[] =
    "decrypt(nonce, data, out) -> bool\n\n"
    "Decrypt and authenticate one AES-GCM message without associated data: ``data`` is the\n"
    "ciphertext then its 16-byte tag, ``nonce`` 12 bytes, ``out`` (writable) exactly\n"
    "len(data) - 16 bytes. False (``out`` wiped) when it does not authenticate. For\n"
    "known-answer tests; sealed files use decrypt_run.";

static PyObject *Key_decrypt(Key *self, PyObject *args) {
    Py_buffer nonce, data, out;
    if (!PyArg_ParseTuple(args, "y*y*w*:decrypt", &nonce, &data, &out))
        return NULL;
    int ok = 0;
    if (nonce.len != NONCE || data.len < TAG || out.len != data.len - TAG) {
        PyErr_Format(PyExc_ValueError, "decrypt: a %d-byte nonce and data of at least %d bytes, "
                     "and an output of len(data) - %d bytes, not %zd, %zd and %zd bytes",
                     NONCE, TAG, TAG, nonce.len, data.len, out.len);
        goto done;
    }
    if (overlap(&data, &out)) {
        PyErr_SetString(PyExc_ValueError, "decrypt: the data and output buffers overlap");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    struct gcm_context_data ctx;
    size_t n = (size_t)out.len;
    ok = open_record(self, &ctx, out.buf, data.buf, n, nonce.buf);
    if (!ok)
        imb_clear_mem(out.buf, n);
    imb_clear_mem(&ctx, sizeof ctx);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&nonce);
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(ok);
}

static const char SEAL_DOC[] =
    "encrypt_run(plain, out, first, last, final, segment_size, final_size) -> None\n\n"
    "Encrypt segments first..last of a sealed file, without the GIL: the inverse of\n"
    "decrypt_run, with the same layout and length checks (``plain`` their plaintexts,\n"
    "``out``, writable, receives their records).";

static PyObject *Key_encrypt_run(Key *self, PyObject *args) {
    Py_buffer plain, out;
    long long first, last, final;
    Py_ssize_t seg, final_size;
    if (!PyArg_ParseTuple(args, "y*w*LLLnn:encrypt_run", &plain, &out, &first, &last, &final, &seg,
                          &final_size))
        return NULL;
    if (run_layout(first, last, final, seg, final_size, out.len, plain.len) < 0)
        goto done;
    if (overlap(&plain, &out)) {
        PyErr_SetString(PyExc_ValueError, "encrypt_run: the plaintext and output buffers overlap");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    struct gcm_context_data ctx;
    uint8_t iv[NONCE];
    const uint8_t *pt = plain.buf;
    uint8_t *ct = out.buf;
    for (long long i = first; i <= last; i++) {
        size_t n = i < final ? (size_t)seg : (size_t)final_size;
        nonce_of(iv, (uint64_t)i, i == final);
        if (self->aes256)
            IMB_AES256_GCM_ENC(imb, self->kd, &ctx, ct, pt, n, iv, NULL, 0, ct + n, TAG);
        else
            IMB_AES128_GCM_ENC(imb, self->kd, &ctx, ct, pt, n, iv, NULL, 0, ct + n, TAG);
        pt += n;
        ct += n + TAG;
    }
    imb_clear_mem(&ctx, sizeof ctx);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&plain);
    PyBuffer_Release(&out);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Key_methods[] = {
    {"decrypt_run", (PyCFunction)Key_decrypt_run, METH_VARARGS, RUN_DOC},
    {"encrypt_run", (PyCFunction)Key_encrypt_run, METH_VARARGS, SEAL_DOC},
    {"decrypt_spans", (PyCFunction)Key_decrypt_spans, METH_VARARGS, SPANS_DOC},
    {"pread_run", (PyCFunction)Key_pread_run, METH_VARARGS, PREAD_RUN_DOC},
    {"pread_spans", (PyCFunction)Key_pread_spans, METH_VARARGS, PREAD_SPANS_DOC},
    {"decrypt", (PyCFunction)Key_decrypt, METH_VARARGS, ONE_DOC},
    {"__reduce__", Key_reduce, METH_NOARGS, "Refused: a Key holds key material."},
    {"__reduce_ex__", Key_reduce, METH_VARARGS, "Refused: a Key holds key material."},
    {"__copy__", Key_reduce, METH_NOARGS, "Refused: a Key holds key material."},
    {"__deepcopy__", Key_reduce, METH_VARARGS, "Refused: a Key holds key material."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KeyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cryptdisk.format._cseal.Key",
    .tp_basicsize = sizeof(Key),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Key(key): an AES-GCM key (16 or 32 bytes) with its schedule and GHASH powers "
              "precomputed, for the segment runs of sealed files.",
    .tp_new = Key_new,
    .tp_dealloc = (destructor)Key_dealloc,
    .tp_repr = (reprfunc)Key_repr,
    .tp_methods = Key_methods,
};

/* -- module --------------------------------------------------------------------------- */

static PyObject *library(PyObject *m, PyObject *unused) {
    static const char *ARCH[] = {"none", "no AES-NI", "SSE", "AVX", "AVX2", "AVX-512"};
    return PyUnicode_FromFormat("intel-ipsec-mb %s (%s)", imb_get_version_str(),
                                imb_arch < IMB_ARCH_NUM ? ARCH[imb_arch] : "?");
}

static PyMethodDef methods[] = {
    {"library", library, METH_NOARGS, "The cipher library and the code path it picked for this CPU."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cseal",
    "The segment loops of sealed files (AES-GCM from intel-ipsec-mb), without the GIL.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cseal(void) {
    if (imb_get_version() < IMB_VERSION_NUM) {
        PyErr_SetString(PyExc_ImportError, "intel-ipsec-mb is older than the headers cryptdisk was built with");
        return NULL;
    }
    if (imb == NULL) {
        imb = alloc_mb_mgr(0);
        if (imb == NULL)
            return PyErr_NoMemory();
        init_mb_mgr_auto(imb, &imb_arch);
        if (imb_get_errno(imb) != 0 || imb_arch == IMB_ARCH_NONE || imb_arch == IMB_ARCH_NOAESNI) {
            /* without AES-NI its GCM is a table implementation: keep cryptography's */
            free_mb_mgr(imb);
            imb = NULL;
            PyErr_SetString(PyExc_ImportError, "intel-ipsec-mb found no AES-NI on this CPU");
            return NULL;
        }
    }
    if (PyType_Ready(&KeyType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&KeyType);
    if (PyModule_AddObject(m, "Key", (PyObject *)&KeyType) < 0) {
        Py_DECREF(&KeyType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
