/* cryptdisk.db._csort: an in-place sort of 64-bit unsigned integers, without the GIL.
 *
 * An insert sorts each block of rows by its key as one array of packed 64-bit integers
 * (src/cryptdisk/db/_blocks.py, _packed_sort_indices). numpy's sort of them is a comparison
 * sort (about 55 ns a value for a block of 655K on the benchmark machine); this is a
 * least-significant-digit radix sort of 11-bit digits (a pass whose digit is the same in
 * every value is skipped), one read to count every digit, a scratch array of the same
 * size. The values are distinct there (each holds its row's position in its low bits,
 * ascending before the sort), so the caller sorts by the bits above the positions only:
 * 4 passes over the 44 bits above 20 bits of positions, where 8-bit digits over all 64
 * bits took 8 (see sort_u64's timings in docs/engine-cost.md). The result is numpy's.
 *
 * Distinct: the exact set of an ungrouped count(DISTINCT col) over a string or binary
 * column (src/cryptdisk/db/_distinct.py). Arrow arrays' values are hashed (a keyed 64-bit
 * hash, its seed drawn per set), spread over 256 partitions by the hash's top byte, each an
 * open-addressing table of (hash, pointer) slots under its own mutex, and each new value is
 * copied into its partition's arena: equal hashes are compared byte by byte, so the count is
 * exact whatever the hash does. Several threads add arrays at once without the GIL; the
 * set's bytes (slots and arenas) are counted, and an add that would pass the set's limit
 * fails instead.
 *
 * byte_array_page: the PLAIN values of a Parquet BYTE_ARRAY data page (each a 4-byte
 * little-endian length, then that many bytes) turned into an Arrow string/binary array's
 * offsets and data (src/cryptdisk/db/_granule.py), without the GIL. Every length is checked
 * against the bytes left before it is used: a page whose values run past its end, leave
 * bytes over, or are fewer than its defined rows is refused with ValueError.
 *
 * one_width_into: the values of such a page whose strings all have one length (hashes,
 * UUIDs, codes) copied, without their lengths, into their place in the data of an Arrow
 * array the caller allocated (a column chunk's pages one after another), every length
 * checked, and whether every byte is ASCII told, without the GIL: a scan of 32-character
 * hashes spent about a fifth of its threads' CPU doing this through NumPy's strided copy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define DIGIT_BITS 11
#define BUCKETS (1 << DIGIT_BITS)
#define MAX_DIGITS ((64 + DIGIT_BITS - 1) / DIGIT_BITS)

/* Sort a[0..n) stably by bits low..63 of each value (a[i] >> low), using tmp[0..n) as
 * scratch; the result ends in a. Values equal in those bits keep their order, so when the
 * low bits are already ascending in a (positions), the result is a fully sorted a.
 * count holds MAX_DIGITS * BUCKETS counters. 11-bit digits: 6 passes at most (4 over the
 * 44 bits above 20 bits of positions), each over a histogram that stays in the L1 cache. */
static void radix_sort(uint64_t *a, uint64_t *tmp, size_t n, int low, size_t *count) {
    const int digits = (64 - low + DIGIT_BITS - 1) / DIGIT_BITS;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = a[i] >> low;
        for (int d = 0; d < digits; d++)
            count[d * BUCKETS + ((v >> (DIGIT_BITS * d)) & (BUCKETS - 1))]++;
    }
    uint64_t *src = a, *dst = tmp;
    for (int d = 0; d < digits; d++) {
        size_t *c = count + d * BUCKETS;
        int skip = 0;
        for (int b = 0; b < BUCKETS; b++) {
            if (c[b] == n) {
                skip = 1;
                break;
            }
            if (c[b])
                break;
        }
        if (skip)
            continue;
        size_t at = 0;
        for (int b = 0; b < BUCKETS; b++) {
            size_t k = c[b];
            c[b] = at;
            at += k;
        }
        const int shift = low + DIGIT_BITS * d;
        for (size_t i = 0; i < n; i++) {
            uint64_t v = src[i];
            dst[c[(v >> shift) & (BUCKETS - 1)]++] = v;
        }
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
}

PyDoc_STRVAR(sort_u64_doc,
    "sort_u64(buffer, low=0)\n--\n\n"
    "Sort a writable, C-contiguous buffer of native 64-bit unsigned integers in place,\n"
    "ascending, without the GIL; stably by the bits from `low` up only (0..63): values\n"
    "whose bits from `low` up are equal keep their order.");

static PyObject *sort_u64(PyObject *self, PyObject *args) {
    PyObject *arg;
    int low = 0;
    if (!PyArg_ParseTuple(args, "O|i:sort_u64", &arg, &low))
        return NULL;
    if (low < 0 || low > 63) {
        PyErr_SetString(PyExc_ValueError, "sort_u64: low must be 0..63");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (view.itemsize != 8 || view.format == NULL ||
        (strcmp(view.format, "Q") != 0 && strcmp(view.format, "L") != 0 &&
         strcmp(view.format, "=Q") != 0 && strcmp(view.format, "<Q") != 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "sort_u64 takes a buffer of uint64");
        return NULL;
    }
    size_t n = (size_t)view.len / 8;
    if (n > 1) {
        uint64_t *tmp = malloc(n * sizeof *tmp);
        size_t *count = calloc((size_t)MAX_DIGITS * BUCKETS, sizeof *count);
        if (tmp == NULL || count == NULL) {
            free(tmp);
            free(count);
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        Py_BEGIN_ALLOW_THREADS
        radix_sort((uint64_t *)view.buf, tmp, n, low, count);
        Py_END_ALLOW_THREADS
        free(tmp);
        free(count);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}


/* ---- Distinct ------------------------------------------------------------------------ */

#define NPART 256
#define FIRST_SLOTS 64
#define FIRST_CHUNK 4096
#define LAST_CHUNK (1 << 20) /* an arena grows by at most 64 of these at a time */
/* Rows ahead whose slot is fetched into the cache while this one is added. */
#define PREFETCH 16

/* A slot: the hash's bits 24-55 above the value's place in its partition's arena (in
 * 4-byte units, plus 1; 0: empty). The arena holds each value as [uint32 length][bytes],
 * padded to 4 bytes, in the order they were added. */
typedef uint64_t slot_t;

typedef struct {
    pthread_mutex_t lock;
    slot_t *slots;
    size_t mask, count;
    uint8_t *arena;
    size_t used, cap;
} part_t;

typedef struct {
    PyObject_HEAD
    part_t parts[NPART];
    uint64_t seed;
    size_t limit;
    /* a partition's first table (from the rows expected; FIRST_SLOTS once squeezed) */
    atomic_size_t first_slots;
    int sized; /* whether it was made larger than FIRST_SLOTS (see squeeze) */
    atomic_size_t bytes;
    atomic_int full;
    atomic_uint turn; /* where the next add starts among the partitions */
} DistinctObject;

static inline uint64_t mum(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t load64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* A keyed 64-bit hash of p[0..n) (wyhash's multiply-fold rounds; not cryptographic: the
 * set compares values whose hashes are equal, so the hash decides speed, never the count). */
static uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t seed) {
    const uint64_t k0 = 0xa0761d6478bd642fULL, k1 = 0xe7037ed1a0b428dbULL;
    uint64_t h = seed ^ mum(seed ^ k0, (uint64_t)n ^ k1);
    while (n >= 16) {
        h = mum(load64(p) ^ k1, load64(p + 8) ^ h);
        p += 16;
        n -= 16;
    }
    uint64_t a = 0, b = 0;
    if (n >= 8) {
        a = load64(p);
        b = load64(p + n - 8);
    } else if (n >= 4) {
        uint32_t x, y;
        memcpy(&x, p, 4);
        memcpy(&y, p + n - 4, 4);
        a = x;
        b = y;
    } else if (n > 0) {
        a = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
    }
    return mum(k1 ^ n, mum(a ^ k0, b ^ h));
}

/* Count `more` bytes against the limit; 0 if that would pass it (the set is then full). */
static int charge(DistinctObject *d, size_t more) {
    size_t now = atomic_fetch_add(&d->bytes, more) + more;
    if (now > d->limit) {
        atomic_fetch_sub(&d->bytes, more);
        atomic_store(&d->full, 1);
        return 0;
    }
    return 1;
}

#define TAG(h) ((h) >> 24 << 32)
#define FULL_AT(size) ((size) / 10 * 7) /* a table grows past 70% full */

/* Place of a copy of value v (n bytes) in partition t's arena, or 0 (limit or malloc). */
static uint64_t keep(DistinctObject *d, part_t *t, const uint8_t *v, uint32_t n) {
    size_t need = (4 + (size_t)n + 3) & ~(size_t)3;
    if (t->cap - t->used < need) {
        size_t cap = t->cap ? 2 * t->cap : FIRST_CHUNK;
        if (cap > t->cap + LAST_CHUNK * 64)
            cap = t->cap + LAST_CHUNK * 64;
        if (cap < t->used + need)
            cap = t->used + need;
        if ((cap >> 2) >= UINT32_MAX || !charge(d, cap - t->cap))
            return 0;
        uint8_t *fresh = realloc(t->arena, cap);
        if (fresh == NULL) {
            atomic_fetch_sub(&d->bytes, cap - t->cap);
            return 0;
        }
        t->arena = fresh;
        t->cap = cap;
    }
    uint8_t *at = t->arena + t->used;
    memcpy(at, &n, 4);
    memcpy(at + 4, v, n);
    uint64_t place = (t->used >> 2) + 1;
    t->used += need;
    return place;
}

static inline void place_slot(slot_t *slots, size_t mask, uint64_t h, uint64_t place) {
    size_t j = h & mask;
    while (slots[j] != 0)
        j = (j + 1) & mask;
    slots[j] = TAG(h) | place;
}

/* Partition t's table made again with `size` slots, its values placed again from the
 * arena (read in order, hashed again). */
static void place_all(DistinctObject *d, part_t *t, slot_t *fresh, size_t size) {
    size_t mask = size - 1;
    for (size_t at = 0; at < t->used;) {
        uint32_t n;
        memcpy(&n, t->arena + at, 4);
        place_slot(fresh, mask, hash_bytes(t->arena + at + 4, n, d->seed), (at >> 2) + 1);
        at += (4 + (size_t)n + 3) & ~(size_t)3;
    }
    free(t->slots);
    t->slots = fresh;
    t->mask = mask;
}

/* Double (or make) partition t's table; 0 on failure (limit or malloc). */
static int grow(DistinctObject *d, part_t *t) {
    size_t size = t->slots ? 2 * (t->mask + 1) : atomic_load(&d->first_slots);
    if (!charge(d, size * sizeof(slot_t)))
        return 0;
    slot_t *fresh = calloc(size, sizeof(slot_t));
    if (fresh == NULL) {
        atomic_fetch_sub(&d->bytes, size * sizeof(slot_t));
        return 0;
    }
    size_t old = t->slots ? t->mask + 1 : 0;
    place_all(d, t, fresh, size);
    if (old)
        atomic_fetch_sub(&d->bytes, old * sizeof(slot_t));
    return 1;
}

/* Partition t's table, if larger than doubling from FIRST_SLOTS would have made it for
 * its values and `more` (sized from the rows expected), made that size; 1 if it shrank. */
static int shrink(DistinctObject *d, part_t *t, size_t more) {
    size_t size = t->slots ? t->mask + 1 : 0, want = FIRST_SLOTS;
    while (want < size && t->count + more > FULL_AT(want))
        want <<= 1;
    if (want >= size)
        return 0;
    slot_t *fresh = calloc(want, sizeof(slot_t));
    if (fresh == NULL)
        return 0;
    place_all(d, t, fresh, want);
    atomic_fetch_sub(&d->bytes, (size - want) * sizeof(slot_t));
    return 1;
}

/* The set at its limit: the tables sized from the rows expected that hold fewer values
 * than that are shrunk to the size doubling would have given them (and tables made from
 * now on start small), so that the set holds whatever it holds without ``expect``.
 * ``own`` (locked by the caller) and every other partition, each taken with trylock (an
 * add holding one is waited for by yielding, a few times at most: two adds squeezing at
 * once never wait on each other); 1 if any bytes were freed (the caller tries again), 0
 * if none can be. */
static int squeeze(DistinctObject *d, part_t *own) {
    if (!d->sized)
        return 0; /* (tables doubled from FIRST_SLOTS: none is larger than doubling made it) */
    int freed = atomic_exchange(&d->first_slots, (size_t)FIRST_SLOTS) > FIRST_SLOTS;
    freed |= shrink(d, own, 1); /* (it is adding a value) */
    uint8_t done[NPART] = {0};
    for (int round = 0; round < 64; round++) {
        int busy = 0;
        for (int p = 0; p < NPART; p++) {
            part_t *t = &d->parts[p];
            if (t == own || done[p])
                continue;
            if (pthread_mutex_trylock(&t->lock) == 0) {
                freed |= shrink(d, t, 0);
                pthread_mutex_unlock(&t->lock);
                done[p] = 1;
            } else {
                busy = 1;
            }
        }
        if (!busy || freed)
            break;
        sched_yield();
    }
    return freed;
}

/* Add value v (n bytes, hash h) to partition t; 0 on failure. */
static int insert(DistinctObject *d, part_t *t, uint64_t h, const uint8_t *v, uint32_t n) {
again:
    if (t->slots == NULL || t->count + 1 > FULL_AT(t->mask + 1)) {
        if (!grow(d, t)) {
            if (squeeze(d, t))
                goto again;
            return 0;
        }
    }
    const uint64_t tag = TAG(h);
    size_t j = h & t->mask;
    for (;;) {
        slot_t s = t->slots[j];
        if (s == 0)
            break;
        if ((s & 0xffffffff00000000ULL) == tag) {
            const uint8_t *kept = t->arena + (((s & 0xffffffffULL) - 1) << 2);
            uint32_t m;
            memcpy(&m, kept, 4);
            if (m == n && memcmp(kept + 4, v, n) == 0)
                return 1;
        }
        j = (j + 1) & t->mask;
    }
    uint64_t place = keep(d, t, v, n);
    if (place == 0) {
        if (squeeze(d, t))
            goto again; /* (its table may have shrunk: the value's slot is looked for again) */
        return 0;
    }
    t->slots[j] = tag | place;
    t->count++;
    return 1;
}

/* A partition's first table for at most `expect` values in all: room for its share
 * (plus four standard deviations of the binomial spread) below FULL_AT, so a set of that
 * many values never doubles and rehashes a table; the tables at most a quarter of
 * `limit` (a bound, not a count: fewer values leave most of each table untouched). */
static size_t first_slots(size_t limit, unsigned long long expect) {
    size_t slots = FIRST_SLOTS;
    if (expect / NPART > FIRST_SLOTS / 2) {
        double share = (double)expect / NPART;
        double need = (share + 4.0 * __builtin_sqrt(share) + 16.0) * 10.0 / 7.0;
        while (slots < need && slots < ((size_t)1 << 40))
            slots <<= 1;
    }
    while (slots > FIRST_SLOTS && slots * sizeof(slot_t) * NPART > limit / 4)
        slots >>= 1;
    return slots;
}

static PyObject *Distinct_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"limit", "seed", "expect", NULL};
    unsigned long long limit, seed, expect = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KK|K", kwlist, &limit, &seed, &expect))
        return NULL;
    DistinctObject *d = (DistinctObject *)type->tp_alloc(type, 0);
    if (d == NULL)
        return NULL;
    for (int p = 0; p < NPART; p++) {
        memset(&d->parts[p], 0, sizeof(part_t));
        pthread_mutex_init(&d->parts[p].lock, NULL);
    }
    d->seed = seed;
    d->limit = (size_t)limit;
    atomic_init(&d->first_slots, first_slots((size_t)limit, expect));
    d->sized = atomic_load(&d->first_slots) > FIRST_SLOTS;
    atomic_init(&d->bytes, 0);
    atomic_init(&d->full, 0);
    atomic_init(&d->turn, 0);
    return (PyObject *)d;
}

static void Distinct_dealloc(DistinctObject *d) {
    for (int p = 0; p < NPART; p++) {
        part_t *t = &d->parts[p];
        free(t->slots);
        free(t->arena);
        pthread_mutex_destroy(&t->lock);
    }
    Py_TYPE(d)->tp_free((PyObject *)d);
}

PyDoc_STRVAR(Distinct_add_doc,
    "add(offsets, data, validity, offset, length, wide)\n--\n\n"
    "Add the values of an Arrow string or binary array, given by its buffers: offsets\n"
    "(int32, or int64 if wide), data, validity (None: no NULL; NULLs are not added), the\n"
    "array's offset and length. Runs without the GIL; other threads may add at once.\n"
    "Returns False, adding what fitted, if the set would pass its limit of bytes.\n"
    "ValueError if the buffers do not describe such an array.");

static PyObject *Distinct_add(DistinctObject *d, PyObject *args) {
    Py_buffer ob, db, vb = {0};
    PyObject *validity;
    Py_ssize_t offset, length;
    int wide;
    if (!PyArg_ParseTuple(args, "y*y*Onnp", &ob, &db, &validity, &offset, &length, &wide))
        return NULL;
    int has_validity = validity != Py_None;
    if (has_validity && PyObject_GetBuffer(validity, &vb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&db);
        return NULL;
    }
    const char *bad = NULL;
    size_t width = wide ? 8 : 4;
    if (offset < 0 || length < 0)
        bad = "negative offset or length";
    else if ((size_t)ob.len / width < (size_t)offset + (size_t)length + 1)
        bad = "offsets buffer too short";
    else if (has_validity && (size_t)vb.len * 8 < (size_t)offset + (size_t)length)
        bad = "validity buffer too short";
    size_t n = (size_t)length;
    uint64_t *hashes = NULL;
    uint32_t *order = NULL;
    int ok = 1;
    if (bad == NULL && n > 0) {
        hashes = malloc(2 * n * sizeof *hashes); /* by row, then by partition */
        order = malloc(n * sizeof *order);
        if (hashes == NULL || order == NULL || n > UINT32_MAX) {
            free(hashes);
            free(order);
            PyBuffer_Release(&ob);
            PyBuffer_Release(&db);
            if (has_validity)
                PyBuffer_Release(&vb);
            return n > UINT32_MAX ? (PyErr_SetString(PyExc_ValueError, "array too long"), NULL)
                                  : PyErr_NoMemory();
        }
    }
    if (bad == NULL && n > 0) {
        const uint8_t *data = db.buf;
        const uint8_t *valid = has_validity ? vb.buf : NULL;
        const int32_t *o32 = ob.buf;
        const int64_t *o64 = ob.buf;
        size_t dlen = (size_t)db.len;
        Py_BEGIN_ALLOW_THREADS
        size_t count[NPART + 1];
        memset(count, 0, sizeof count);
        size_t kept = 0;
        for (size_t i = 0; i < n && bad == NULL; i++) {
            size_t at = (size_t)offset + i;
            if (valid && !((valid[at >> 3] >> (at & 7)) & 1)) {
                hashes[i] = 0;
                continue;
            }
            int64_t lo = wide ? o64[at] : o32[at], hi = wide ? o64[at + 1] : o32[at + 1];
            if (lo < 0 || hi < lo || (uint64_t)hi > dlen || hi - lo > (int64_t)UINT32_MAX) {
                bad = "offsets out of the data buffer";
                break;
            }
            uint64_t h = hash_bytes(data + lo, (size_t)(hi - lo), d->seed);
            hashes[i] = h;
            count[(h >> 56) + 1]++;
            kept++;
        }
        if (bad == NULL && kept) {
            for (int p = 0; p < NPART; p++)
                count[p + 1] += count[p];
            size_t start[NPART];
            memcpy(start, count, sizeof start);
            /* the hashes again in partition order, so the adds below read them in turn */
            uint64_t *ordered = hashes + n;
            for (size_t i = 0; i < n; i++) {
                size_t at = (size_t)offset + i;
                if (valid && !((valid[at >> 3] >> (at & 7)) & 1))
                    continue;
                size_t k = start[hashes[i] >> 56]++;
                order[k] = (uint32_t)i;
                ordered[k] = hashes[i];
            }
            /* adds running at once start at different partitions, so they rarely wait */
            unsigned first = atomic_fetch_add(&d->turn, 101);
            for (int q = 0; q < NPART && ok; q++) {
                int p = (int)((first + (unsigned)q) % NPART);
                if (count[p] == count[p + 1])
                    continue;
                part_t *t = &d->parts[p];
                pthread_mutex_lock(&t->lock);
                for (size_t k = count[p]; k < count[p + 1]; k++) {
                    if (k + PREFETCH < count[p + 1] && t->slots != NULL)
                        __builtin_prefetch(&t->slots[ordered[k + PREFETCH] & t->mask]);
                    size_t i = order[k], at = (size_t)offset + i;
                    int64_t lo = wide ? o64[at] : o32[at], hi = wide ? o64[at + 1] : o32[at + 1];
                    if (!insert(d, t, ordered[k], data + lo, (uint32_t)(hi - lo))) {
                        ok = 0;
                        break;
                    }
                }
                pthread_mutex_unlock(&t->lock);
            }
        }
        Py_END_ALLOW_THREADS
    }
    free(hashes);
    free(order);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    if (has_validity)
        PyBuffer_Release(&vb);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (!ok && !atomic_load(&d->full))
        return PyErr_NoMemory();
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(Distinct_count_doc,
    "count()\n--\n\nHow many distinct values were added.");

static PyObject *Distinct_count(DistinctObject *d, PyObject *unused) {
    size_t total = 0;
    for (int p = 0; p < NPART; p++) {
        pthread_mutex_lock(&d->parts[p].lock);
        total += d->parts[p].count;
        pthread_mutex_unlock(&d->parts[p].lock);
    }
    return PyLong_FromSize_t(total);
}

PyDoc_STRVAR(Distinct_nbytes_doc,
    "nbytes()\n--\n\nThe bytes the set holds (tables and copies of values).");

static PyObject *Distinct_nbytes(DistinctObject *d, PyObject *unused) {
    return PyLong_FromSize_t(atomic_load(&d->bytes));
}

static PyMethodDef Distinct_methods[] = {
    {"add", (PyCFunction)Distinct_add, METH_VARARGS, Distinct_add_doc},
    {"count", (PyCFunction)Distinct_count, METH_NOARGS, Distinct_count_doc},
    {"nbytes", (PyCFunction)Distinct_nbytes, METH_NOARGS, Distinct_nbytes_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Distinct_doc,
    "Distinct(limit, seed, expect=0)\n--\n\n"
    "An exact set of byte strings (Arrow string or binary values) holding at most `limit`\n"
    "bytes, hashed under `seed`; `expect`, an upper bound on the values to be added (the\n"
    "rows), sizes its tables at once (within a quarter of `limit`) instead of doubling;\n"
    "at the limit they shrink to the sizes doubling would have given them, so the set\n"
    "holds whatever it holds without `expect`.");

static PyTypeObject DistinctType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cryptdisk.db._csort.Distinct",
    .tp_basicsize = sizeof(DistinctObject),
    .tp_dealloc = (destructor)Distinct_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Distinct_doc,
    .tp_methods = Distinct_methods,
    .tp_new = Distinct_new,
};


/* ---- byte_array_page ------------------------------------------------------------------ */

/* Decode `rows` rows of PLAIN BYTE_ARRAY values from src[0..len): row i has a value when
 * defined is NULL or defined[i] != 0. offsets[0..rows] and data[0..dlen) are filled, where
 * dlen = len - 4 * (defined rows) was checked by the caller to fit. Returns NULL, or what is
 * wrong with the page. *high says whether a byte of the data is not ASCII. */
static const char *byte_array_fill(const unsigned char *src, size_t len, Py_ssize_t rows,
                                   const unsigned char *defined, int32_t *offsets,
                                   unsigned char *data, size_t dlen, int *high) {
    size_t pos = 0, out = 0;
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (defined != NULL && !defined[i]) {
            offsets[i + 1] = (int32_t)out;
            continue;
        }
        if (len - pos < 4)
            return "a value's length runs past the page";
        const unsigned char *p = src + pos;
        size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
        pos += 4;
        if (n > len - pos)
            return "a value runs past the page";
        if (n > dlen - out)
            return "the values leave no room for the lengths of the rows after them";
        /* A short value is copied as 16 bytes where both buffers have them from here: the
         * bytes past it are written again by the values after it (or by nothing, at the
         * very end, where the exact copy below is taken). */
        if (n <= 16 && len - pos >= 16 && dlen - out >= 16)
            memcpy(data + out, src + pos, 16);
        else
            memcpy(data + out, src + pos, n);
        pos += n;
        out += n;
        offsets[i + 1] = (int32_t)out;
    }
    if (pos != len)
        return "bytes left over after the page's values";
    uint64_t any = 0; /* the top bit of any byte of the data: not all ASCII */
    size_t k = 0;
    for (; k + 8 <= dlen; k += 8) {
        uint64_t w;
        memcpy(&w, data + k, 8);
        any |= w;
    }
    for (; k < dlen; k++)
        any |= data[k];
    *high = (any & UINT64_C(0x8080808080808080)) != 0;
    return NULL;
}

PyDoc_STRVAR(byte_array_page_doc,
    "byte_array_page(values, rows, defined=None)\n--\n\n"
    "The PLAIN values of a BYTE_ARRAY data page (a 4-byte little-endian length, then its\n"
    "bytes, for each defined row) as (offsets, data, ascii): the int32 offsets of `rows` + 1\n"
    "rows of an Arrow string/binary array, its data, and whether every byte is ASCII.\n"
    "`defined`: None (every row has a value) or `rows` bytes, nonzero where a row has one.\n"
    "None when the data would not fit int32 offsets; ValueError when the values do not fill\n"
    "the page exactly (a length past its end, bytes left over, fewer values than rows).");

static PyObject *byte_array_page(PyObject *self, PyObject *args) {
    Py_buffer values, defined = {0};
    Py_ssize_t rows;
    PyObject *def_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*n|O:byte_array_page", &values, &rows, &def_obj))
        return NULL;
    PyObject *result = NULL, *offsets = NULL, *data = NULL;
    int have_defined = def_obj != Py_None;
    if (have_defined && PyObject_GetBuffer(def_obj, &defined, PyBUF_C_CONTIGUOUS) < 0) {
        have_defined = 0;
        goto done;
    }
    if (rows < 0 || rows >= INT32_MAX || (have_defined && defined.len != rows)) {
        PyErr_SetString(PyExc_ValueError, "byte_array_page: rows do not match the levels");
        goto done;
    }
    size_t present = (size_t)rows;
    if (have_defined) {
        const unsigned char *d = defined.buf;
        present = 0;
        for (Py_ssize_t i = 0; i < rows; i++)
            present += d[i] != 0;
    }
    size_t len = (size_t)values.len;
    if (present > len / 4) {
        PyErr_SetString(PyExc_ValueError, "the page is too short for its values' lengths");
        goto done;
    }
    size_t dlen = len - 4 * present;
    if (dlen > INT32_MAX) {  /* (large_string's offsets: left to pyarrow's reader) */
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * ((size_t)rows + 1)));
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)dlen);
    if (offsets == NULL || data == NULL)
        goto done;
    const char *bad;
    int high = 0;
    Py_BEGIN_ALLOW_THREADS
    bad = byte_array_fill(values.buf, len, rows, have_defined ? defined.buf : NULL,
                          (int32_t *)PyBytes_AS_STRING(offsets),
                          (unsigned char *)PyBytes_AS_STRING(data), dlen, &high);
    Py_END_ALLOW_THREADS
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto done;
    }
    result = Py_BuildValue("(OON)", offsets, data, PyBool_FromLong(!high));
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    if (have_defined)
        PyBuffer_Release(&defined);
    PyBuffer_Release(&values);
    return result;
}

/* ---- one_width_into ------------------------------------------------------------------- */

/* Copy `count` values of `width` bytes, each after its 4-byte length, from src to dst
 * (packed). Returns 0 if a length is not `width`, else 1. (The caller checks the copy for
 * bytes that are not ASCII; the widths below are copied and checked at once.) */
static int one_width_copy(const unsigned char *src, size_t count, size_t width,
                          unsigned char *dst) {
    for (size_t i = 0; i < count; i++) {
        uint32_t n;
        memcpy(&n, src, 4);  /* (little-endian: the only byte order built for) */
        if (n != (uint32_t)width)
            return 0;
        memcpy(dst, src + 4, width);
        src += 4 + width;
        dst += width;
    }
    return 1;
}

/* one_width_copy for a width W (a multiple of 8) known here: 8-byte words, each also
 * or-ed into *high (its top bits: a byte that is not ASCII). */
#define ONE_WIDTH_FIXED(W) \
    static int one_width_copy_##W(const unsigned char *src, size_t count, \
                                  unsigned char *dst, uint64_t *high) { \
        uint64_t any = 0; \
        for (size_t i = 0; i < count; i++) { \
            uint32_t n; \
            memcpy(&n, src, 4); \
            if (n != (W)) \
                return 0; \
            for (size_t k = 0; k < (W) / 8; k++) { \
                uint64_t w; \
                memcpy(&w, src + 4 + 8 * k, 8); \
                any |= w; \
                memcpy(dst + 8 * k, &w, 8); \
            } \
            src += 4 + (W); \
            dst += (W); \
        } \
        *high = any; \
        return 1; \
    }
ONE_WIDTH_FIXED(16)
ONE_WIDTH_FIXED(32)
ONE_WIDTH_FIXED(40)
ONE_WIDTH_FIXED(64)

PyDoc_STRVAR(one_width_into_doc,
    "one_width_into(values, count, width, out, at)\n--\n\n"
    "Copy the `count` PLAIN BYTE_ARRAY values of a data page's `values` (each a 4-byte\n"
    "little-endian length, then its bytes) whose lengths must all be `width` into the\n"
    "writable buffer `out` at byte `at`, packed (an Arrow string array's data). Returns\n"
    "None if a length is not `width` (nothing is promised about `out` then), else whether\n"
    "every byte copied is ASCII. ValueError when `values` is not exactly `count` such\n"
    "values or `out` has no room for them.");

static PyObject *one_width_into(PyObject *self, PyObject *args) {
    Py_buffer values, out;
    Py_ssize_t count, width, at;
    if (!PyArg_ParseTuple(args, "y*nnw*n:one_width_into", &values, &count, &width, &out,
                          &at)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (count < 0 || width < 0 || at < 0 || (size_t)count > (size_t)values.len / 4
            || (count > 0 && width > values.len)
            || (size_t)values.len != (size_t)count * (4 + (size_t)width)) {
        PyErr_SetString(PyExc_ValueError, "one_width_into: the values are not count values "
                        "of width bytes");
        goto done;
    }
    if (at > out.len || (size_t)count * (size_t)width > (size_t)(out.len - at)) {
        PyErr_SetString(PyExc_ValueError, "one_width_into: no room for the values");
        goto done;
    }
    const unsigned char *src = values.buf;
    unsigned char *dst = (unsigned char *)out.buf + at;
    size_t n = (size_t)count, w = (size_t)width;
    uint64_t high = 0;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 16: ok = one_width_copy_16(src, n, dst, &high); break;
    case 32: ok = one_width_copy_32(src, n, dst, &high); break;
    case 40: ok = one_width_copy_40(src, n, dst, &high); break;
    case 64: ok = one_width_copy_64(src, n, dst, &high); break;
    default:
        ok = one_width_copy(src, n, w, dst);
        if (ok) {  /* the ASCII check over what was copied */
            size_t len = n * w, k = 0;
            for (; k + 8 <= len; k += 8) {
                uint64_t x;
                memcpy(&x, dst + k, 8);
                high |= x;
            }
            for (; k < len; k++)
                high |= dst[k];
        }
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        result = PyBool_FromLong((high & UINT64_C(0x8080808080808080)) == 0);
    }
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"sort_u64", sort_u64, METH_VARARGS, sort_u64_doc},
    {"byte_array_page", byte_array_page, METH_VARARGS, byte_array_page_doc},
    {"one_width_into", one_width_into, METH_VARARGS, one_width_into_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_csort",
    .m_doc = "An in-place radix sort of 64-bit unsigned integers, and an exact set of byte\n"
              "strings for count(DISTINCT), both without the GIL; PLAIN BYTE_ARRAY Parquet pages\n"
              "decoded into Arrow offsets and data, and those of one length copied into an array's data.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__csort(void) {
    if (PyType_Ready(&DistinctType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&DistinctType);
    if (PyModule_AddObject(m, "Distinct", (PyObject *)&DistinctType) < 0) {
        Py_DECREF(&DistinctType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
