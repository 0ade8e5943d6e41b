/*
 * cryptdisk.sqlite._cvfs: the encrypting SQLite VFS, in C.
 *
 * The same files, byte for byte, as the Python VFS in _vfs.py and _store.py
 * (cryptdisk's mutable format, docs/format.md): header(128) || record*, each
 * record nonce(16) || AES-GCM(DEK, nonce, plaintext, file_id || u64le(index))
 * || tag(16), a fresh random nonce on every write. The Python VFS is the
 * reference; this one exists because SQLite calls a VFS several times per
 * transaction and each call into Python costs more than the AES-GCM of a page.
 * Behaviour, including everything in docs/sqlite.md about crashes (the
 * -cdtail side file, torn journal/WAL segments read as zeros, the page-1 peek,
 * a cut record at the end), follows _vfs.py and _store.py; the comments there
 * explain why. tests/sqlite runs every test against both VFSes, and checks that
 * each reads what the other writes.
 *
 * This module is both a Python extension (register a VFS per keyring) and a
 * SQLite loadable extension (sqlite3_cvfs_init), because it must call the
 * SQLite library apsw was built with, which it can only reach through the
 * routines SQLite hands to a loadable extension. Python does what touches
 * keys: a callback authenticates an existing header and unwraps its data key,
 * or writes a header for a new file. Errors become Python exceptions left
 * pending for apsw (as apsw does for its own VFS methods), so the application
 * gets PageAuthenticationError with the path and offset.
 *
 * Cipher primitives are OpenSSL's (EVP AES-GCM, RAND_bytes); none is written
 * here. I/O goes through the default VFS's file methods on the raw file, which
 * also does the locking and the wal-index (-shm, not encrypted).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sqlite3ext.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

static const sqlite3_api_routines *sqlite3_api = NULL;

#define HEADER_SIZE 128
#define NONCE 16
#define TAG 16
#define OVERHEAD (NONCE + TAG)
#define FLUSH_AT (1 << 20)
#define KIND_MAIN 0
#define KIND_JOURNAL 1
#define KIND_WAL 2
#define KIND_TEMP 3
#define CD_AUTH (-1) /* internal: a segment failed authentication (p->fail_index) */
#define ERR_AUTH 0
#define ERR_TRUNCATED 1
#define TAIL_SUFFIX "-cdtail"

static const int RETRY_US[] = {0, 1000, 5000, 20000};
#define RETRIES 4

struct cdFile;

typedef struct cdVfs {
    sqlite3_vfs base;
    sqlite3_vfs *root;
    PyObject *header_for; /* (path, header bytes | None, segment size) -> (header, dek) */
    PyObject *raiser;     /* (error code, message, offset, path) -> exception */
    PyObject *warner;     /* (message) -> None */
    pthread_mutex_t lock;
    struct cdFile *journals;
    char name[64];
} cdVfs;

typedef struct cdFile {
    sqlite3_file base;
    sqlite3_file *real;
    cdVfs *vfs;
    const char *path;
    int kind;
    int anonymous;
    int gather;
    int torn_as_hole;
    /* the store, once the file has a header */
    int loaded;
    EVP_CIPHER_CTX *enc;
    EVP_CIPHER_CTX *dec;
    unsigned char ad[24]; /* file_id || u64le(index) */
    sqlite3_int64 seg;
    sqlite3_int64 rec;
    unsigned char *rbuf;   /* two records */
    unsigned char *plain;  /* one segment */
    unsigned char *plain2; /* one segment */
    unsigned char *batch;
    sqlite3_int64 batch_cap;
    sqlite3_int64 rec_len; /* length of the record in rbuf that last authenticated */
    sqlite3_int64 fail_index;
    int tail_fd;
    char *tail_path;
    unsigned char *tail_map; /* the side file, mapped (16 + rec bytes), or NULL */
    /* the partial segment at the end of a journal or WAL, as this file last wrote it: the
     * next append extends it without reading and decrypting it (valid while the nonce on
     * disk is still tc_rec's, i.e. nobody rewrote it; see cd_cached_tail) */
    int tc_valid;
    sqlite3_int64 tc_index;
    sqlite3_int64 tc_len;
    unsigned char *tc_plain;
    unsigned char *tc_rec;
    /* WAL only: the end of what this file wrote since SQLite last started the WAL over
     * (wrote its header at offset 0). Bytes past it are frames of an older generation,
     * which SQLite never reads again (their salts differ), so a write that ends past it
     * fills the rest of its last segment with zeros instead of reading and decrypting them. */
    sqlite3_int64 wal_high;
    /* WAL only: the plaintext of segments this file sealed, in MIRROR_BYTES of slots (by
     * index modulo the slot count), each with the nonce it was sealed with. The checkpoint
     * reads back the frames just written; a segment whose record on disk still has that
     * nonce is copied from here instead of read and decrypted (see cd_mirror_read). */
    unsigned char *mirror;
    unsigned char *mirror_nonce;
    sqlite3_int64 *mirror_tag;
    sqlite3_int64 *mirror_len;
    sqlite3_int64 mirror_slots;
    /* gathered journal / WAL bytes */
    unsigned char *pend;
    sqlite3_int64 pend_len;
    sqlite3_int64 pend_cap;
    sqlite3_int64 pend_start;
    int write_through;
    /* a rollback journal: the name pointer SQLite gave its database file when it opened it
     * (sqlite3_filename_database), so the journal of this very connection is found, not
     * another connection's journal of the same file */
    const char *journal_of;
    char *journal_of_copy; /* the database's path, for names a VFS shim above copied */
    struct cdFile *next_journal;
} cdFile;

/* -- Python callbacks (with the GIL; apsw releases it around SQLite calls) -- */

static void cd_warn(cdFile *p, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(p->vfs->warner, "s", msg);
    if (r == NULL)
        PyErr_WriteUnraisable(p->vfs->warner);
    Py_XDECREF(r);
    PyGILState_Release(g);
}

/* Leave a cryptdisk exception pending for apsw, which raises it to the caller of the statement. */
static int cd_raise(cdFile *p, int code, sqlite3_int64 offset, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *exc = PyObject_CallFunction(p->vfs->raiser, "isLs", code, msg, (long long)offset, p->path);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    PyGILState_Release(g);
    return SQLITE_CORRUPT;
}

static int cd_auth_error(cdFile *p) {
    sqlite3_int64 where = HEADER_SIZE + p->fail_index * p->rec;
    return cd_raise(p, ERR_AUTH, where,
                    "%s: failed to decrypt and authenticate segment %lld at offset %lld", p->path,
                    (long long)p->fail_index, (long long)where);
}

/* -- the cipher ------------------------------------------------------------ */

/* Process-wide counts of records sealed and opened, and their bytes (for tests and tuning). */
static unsigned long long n_seal, n_seal_bytes, n_unseal, n_unseal_bytes;

static void cd_set_index(cdFile *p, sqlite3_int64 index) {
    unsigned long long v = (unsigned long long)index;
    for (int i = 0; i < 8; i++)
        p->ad[16 + i] = (unsigned char)(v >> (8 * i));
}

/* Seal n plaintext bytes as segment index into dst (n + OVERHEAD bytes). */
static int cd_seal(cdFile *p, sqlite3_int64 index, const unsigned char *plain, int n, unsigned char *dst) {
    int len = 0;
    n_seal++;
    n_seal_bytes += (unsigned long long)n;
    if (RAND_bytes(dst, NONCE) != 1)
        return SQLITE_IOERR;
    cd_set_index(p, index);
    if (EVP_EncryptInit_ex(p->enc, NULL, NULL, NULL, dst) != 1 ||
        EVP_EncryptUpdate(p->enc, NULL, &len, p->ad, sizeof p->ad) != 1 ||
        (n > 0 && EVP_EncryptUpdate(p->enc, dst + NONCE, &len, plain, n) != 1) ||
        EVP_EncryptFinal_ex(p->enc, dst + NONCE + n, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(p->enc, EVP_CTRL_GCM_GET_TAG, TAG, dst + NONCE + n) != 1)
        return SQLITE_IOERR;
    return SQLITE_OK;
}

/* Open a record of got bytes; 1 if it authenticates, else 0 with out wiped. */
static int cd_unseal(cdFile *p, sqlite3_int64 index, unsigned char *record, sqlite3_int64 got, unsigned char *out) {
    int n = (int)(got - OVERHEAD), len = 0, ok;
    if (n <= 0)
        return 0;
    n_unseal++;
    n_unseal_bytes += (unsigned long long)n;
    cd_set_index(p, index);
    ok = EVP_DecryptInit_ex(p->dec, NULL, NULL, NULL, record) == 1 &&
         EVP_DecryptUpdate(p->dec, NULL, &len, p->ad, sizeof p->ad) == 1 &&
         EVP_DecryptUpdate(p->dec, out, &len, record + NONCE, n) == 1 &&
         EVP_CIPHER_CTX_ctrl(p->dec, EVP_CTRL_GCM_SET_TAG, TAG, record + NONCE + n) == 1 &&
         EVP_DecryptFinal_ex(p->dec, out + len, &len) == 1;
    if (!ok)
        OPENSSL_cleanse(out, (size_t)n); /* OpenSSL wrote unauthenticated plaintext: wipe it */
    return ok;
}

/* -- raw I/O through the default VFS's file -------------------------------- */

static int raw_size(cdFile *p, sqlite3_int64 *out) {
    return p->real->pMethods->xFileSize(p->real, out);
}

/* The default VFS reads and writes at most 128 KiB per call (SQLite never asks for more). */
#define RAW_CHUNK 65536
#define MIRROR_BYTES (4 << 20)

/* Read up to n raw bytes at where; *got is how many the file had. */
static int raw_read(cdFile *p, unsigned char *buf, sqlite3_int64 n, sqlite3_int64 where, sqlite3_int64 *got) {
    sqlite3_int64 pos = 0;
    while (pos < n) {
        sqlite3_int64 k = n - pos < RAW_CHUNK ? n - pos : RAW_CHUNK;
        int rc = p->real->pMethods->xRead(p->real, buf + pos, (int)k, where + pos);
        if (rc == SQLITE_OK) {
            pos += k;
            continue;
        }
        if (rc != SQLITE_IOERR_SHORT_READ)
            return rc;
        sqlite3_int64 size;
        if ((rc = raw_size(p, &size)) != SQLITE_OK)
            return rc;
        *got = size <= where ? 0 : (size - where < n ? size - where : n);
        return SQLITE_OK;
    }
    *got = n;
    return SQLITE_OK;
}

static int raw_write(cdFile *p, const unsigned char *buf, sqlite3_int64 n, sqlite3_int64 where) {
    for (sqlite3_int64 pos = 0; pos < n; pos += RAW_CHUNK) {
        sqlite3_int64 k = n - pos < RAW_CHUNK ? n - pos : RAW_CHUNK;
        int rc = p->real->pMethods->xWrite(p->real, buf + pos, (int)k, where + pos);
        if (rc != SQLITE_OK)
            return rc;
    }
    return SQLITE_OK;
}

static void pause_us(int us) {
    if (us > 0)
        usleep((useconds_t)us);
    else
        sched_yield();
}

/* -- the side file of the segment being rewritten (see _tail.py) ----------- */

static void put_u64le(unsigned char *out, unsigned long long v) {
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (8 * i));
}

static unsigned long long get_u64le(const unsigned char *in) {
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++)
        v |= (unsigned long long)in[i] << (8 * i);
    return v;
}

/* Save the record of segment index before it is rewritten: index u64le || length u64le ||
 * record. The side file stays mapped, so a save is two stores and a copy, no system call;
 * what is in the mapping is in the page cache, so it survives the process being killed. */
static int tail_save(cdFile *p, sqlite3_int64 index, const unsigned char *record, sqlite3_int64 len) {
    unsigned char head[16];
    struct iovec iov[2];
    size_t size = (size_t)(16 + p->rec);
    put_u64le(head, (unsigned long long)index);
    put_u64le(head + 8, (unsigned long long)len);
    if (p->tail_fd < 0) {
        struct stat st;
        p->tail_fd = open(p->tail_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (p->tail_fd < 0)
            return SQLITE_IOERR_WRITE;
        if (fstat(p->tail_fd, &st) == 0 && (st.st_size >= (off_t)size || ftruncate(p->tail_fd, (off_t)size) == 0)) {
            void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->tail_fd, 0);
            p->tail_map = map == MAP_FAILED ? NULL : map;
        }
    }
    if (p->tail_map != NULL) {
        memcpy(p->tail_map, head, 16);
        memcpy(p->tail_map + 16, record, (size_t)len);
        return SQLITE_OK;
    }
    iov[0].iov_base = head;
    iov[0].iov_len = 16;
    iov[1].iov_base = (void *)record;
    iov[1].iov_len = (size_t)len;
    if (pwritev(p->tail_fd, iov, 2, 0) != (ssize_t)(16 + len))
        return SQLITE_IOERR_WRITE;
    return SQLITE_OK;
}

/* The saved record of segment index into into (up to one record); its length, or 0. */
static sqlite3_int64 tail_load(cdFile *p, sqlite3_int64 index, unsigned char *into) {
    unsigned char head[16];
    unsigned long long len;
    ssize_t got = 0;
    int fd = open(p->tail_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    if (pread(fd, head, 16, 0) == 16 && get_u64le(head) == (unsigned long long)index) {
        len = get_u64le(head + 8);
        if (len > 0 && len <= (unsigned long long)p->rec)
            got = pread(fd, into, (size_t)len, 16);
    }
    close(fd);
    return got > 0 ? got : 0;
}

/* -- the store ------------------------------------------------------------- */

static int cd_split_size(cdFile *p, sqlite3_int64 raw, sqlite3_int64 *full, sqlite3_int64 *rest) {
    if (raw < HEADER_SIZE)
        return 0;
    *full = (raw - HEADER_SIZE) / p->rec;
    *rest = (raw - HEADER_SIZE) % p->rec;
    return 1;
}

/* Plaintext size now (another process may have written). */
static int cd_size(cdFile *p, sqlite3_int64 *out) {
    sqlite3_int64 raw, full, rest;
    int rc = raw_size(p, &raw);
    if (rc != SQLITE_OK)
        return rc;
    if (!cd_split_size(p, raw, &full, &rest)) {
        *out = 0;
        return SQLITE_OK;
    }
    if (rest == 0 || rest > OVERHEAD) {
        *out = full * p->seg + (rest ? rest - OVERHEAD : 0);
        return SQLITE_OK;
    }
    for (int i = 0; i < RETRIES; i++) {
        pause_us(RETRY_US[i]); /* maybe another process is appending a record right now */
        if ((rc = raw_size(p, &raw)) != SQLITE_OK)
            return rc;
        if (!cd_split_size(p, raw, &full, &rest)) {
            *out = 0;
            return SQLITE_OK;
        }
        if (rest == 0 || rest > OVERHEAD) {
            *out = full * p->seg + (rest ? rest - OVERHEAD : 0);
            return SQLITE_OK;
        }
    }
    /* At most OVERHEAD bytes of a record: an append cut by a crash (see _store.py). */
    cd_warn(p, "%s: ignoring a cut record of %lld bytes at the end (a write cut by a crash?)",
            p->path, (long long)rest);
    *out = full * p->seg;
    return SQLITE_OK;
}

/* Decrypt segment index into out; *n is its plaintext length (0 past the end).
 * Returns CD_AUTH when it does not authenticate (and is not a torn journal/WAL segment). */
static int cd_decrypt(cdFile *p, sqlite3_int64 index, unsigned char *out, sqlite3_int64 *n) {
    sqlite3_int64 where = HEADER_SIZE + index * p->rec, got;
    int rc = raw_read(p, p->rbuf, p->rec, where, &got);
    if (rc != SQLITE_OK)
        return rc;
    if (got == 0) {
        *n = 0;
        return SQLITE_OK;
    }
    if (cd_unseal(p, index, p->rbuf, got, out)) {
        p->rec_len = got;
        *n = got - OVERHEAD;
        return SQLITE_OK;
    }
    for (int i = 0; i < RETRIES; i++) {
        /* another process may be rewriting this very segment: read again */
        pause_us(RETRY_US[i]);
        if ((rc = raw_read(p, p->rbuf, p->rec, where, &got)) != SQLITE_OK)
            return rc;
        if (got && cd_unseal(p, index, p->rbuf, got, out)) {
            p->rec_len = got;
            *n = got - OVERHEAD;
            return SQLITE_OK;
        }
    }
    if (p->tail_path != NULL) { /* an interrupted rewrite? */
        sqlite3_int64 saved = tail_load(p, index, p->rbuf) - OVERHEAD;
        if (saved > 0 && saved <= got - OVERHEAD && cd_unseal(p, index, p->rbuf, saved + OVERHEAD, out)) {
            p->rec_len = saved + OVERHEAD;
            memset(out + saved, 0, (size_t)(got - OVERHEAD - saved));
            *n = got - OVERHEAD;
            return SQLITE_OK;
        }
    }
    if (p->torn_as_hole) {
        sqlite3_int64 k = got > OVERHEAD ? got - OVERHEAD : 0;
        memset(out, 0, (size_t)k);
        cd_warn(p, "%s: segment %lld at offset %lld does not authenticate; SQLite sees it as a torn write (zeros)",
                p->path, (long long)index, (long long)where);
        *n = k;
        return SQLITE_OK;
    }
    p->fail_index = index;
    return CD_AUTH;
}

/* The tail of segment index and the head of the next, in one read; 1 on success. */
static int cd_straddle(cdFile *p, sqlite3_int64 index, sqlite3_int64 lo, sqlite3_int64 amount, unsigned char *buf) {
    sqlite3_int64 head = p->seg - lo, got, n2;
    if (raw_read(p, p->rbuf, 2 * p->rec, HEADER_SIZE + index * p->rec, &got) != SQLITE_OK)
        return 0;
    n2 = got - p->rec - OVERHEAD;
    if (n2 < amount - head)
        return 0;
    if (!cd_unseal(p, index, p->rbuf, p->rec, p->plain))
        return 0;
    if (!cd_unseal(p, index + 1, p->rbuf + p->rec, got - p->rec, p->plain2)) {
        OPENSSL_cleanse(p->plain, (size_t)p->seg);
        return 0;
    }
    memcpy(buf, p->plain + lo, (size_t)head);
    memcpy(buf + head, p->plain2, (size_t)(amount - head));
    return 1;
}

static int cd_mirror_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset);

/* Up to amount plaintext bytes at offset into buf; *got is how many (fewer only at the end). */
static int cd_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset, sqlite3_int64 *got) {
    sqlite3_int64 seg = p->seg, index = offset / seg, lo = offset % seg, pos = 0, n;
    int rc;
    if (lo == 0 && amount == seg) { /* the page fast path */
        rc = cd_decrypt(p, index, buf, &n);
        *got = n;
        return rc;
    }
    if (p->mirror != NULL && cd_mirror_read(p, buf, amount, offset)) {
        *got = amount;
        return SQLITE_OK;
    }
    if (lo && amount <= seg && lo + amount > seg && cd_straddle(p, index, lo, amount, buf)) {
        *got = amount;
        return SQLITE_OK;
    }
    while (pos < amount) {
        index = (offset + pos) / seg;
        lo = (offset + pos) % seg;
        sqlite3_int64 take = seg - lo < amount - pos ? seg - lo : amount - pos;
        if (lo == 0 && take == seg) {
            if ((rc = cd_decrypt(p, index, buf + pos, &n)) != SQLITE_OK)
                return rc;
        } else {
            if ((rc = cd_decrypt(p, index, p->plain, &n)) != SQLITE_OK)
                return rc;
            n -= lo;
            if (n > 0) {
                if (n > take)
                    n = take;
                memcpy(buf + pos, p->plain + lo, (size_t)n);
            }
        }
        if (n < take) {
            *got = pos + (n > 0 ? n : 0);
            return SQLITE_OK;
        }
        pos += take;
    }
    *got = amount;
    return SQLITE_OK;
}

static void mirror_put(cdFile *p, sqlite3_int64 index, const unsigned char *plain, sqlite3_int64 len,
                       const unsigned char *nonce) {
    sqlite3_int64 slot;
    if (p->kind != KIND_WAL)
        return;
    if (p->mirror == NULL) {
        sqlite3_int64 slots = MIRROR_BYTES / p->seg < 2 ? 2 : MIRROR_BYTES / p->seg;
        p->mirror = sqlite3_malloc64((sqlite3_uint64)(slots * p->seg));
        p->mirror_nonce = sqlite3_malloc64((sqlite3_uint64)(slots * NONCE));
        p->mirror_tag = sqlite3_malloc64((sqlite3_uint64)slots * sizeof(sqlite3_int64));
        p->mirror_len = sqlite3_malloc64((sqlite3_uint64)slots * sizeof(sqlite3_int64));
        if (!p->mirror || !p->mirror_nonce || !p->mirror_tag || !p->mirror_len) {
            sqlite3_free(p->mirror);
            sqlite3_free(p->mirror_nonce);
            sqlite3_free(p->mirror_tag);
            sqlite3_free(p->mirror_len);
            p->mirror = NULL;
            return; /* no mirror: reads decrypt, as they would anyway */
        }
        p->mirror_slots = slots;
        for (sqlite3_int64 i = 0; i < slots; i++)
            p->mirror_tag[i] = -1;
    }
    slot = index % p->mirror_slots;
    memcpy(p->mirror + slot * p->seg, plain, (size_t)len);
    memcpy(p->mirror_nonce + slot * NONCE, nonce, NONCE);
    p->mirror_len[slot] = len;
    p->mirror_tag[slot] = index;
}

static void mirror_drop(cdFile *p, sqlite3_int64 index) {
    if (p->mirror != NULL) {
        if (index < 0) {
            for (sqlite3_int64 i = 0; i < p->mirror_slots; i++)
                p->mirror_tag[i] = -1;
        } else if (p->mirror_tag[index % p->mirror_slots] == index) {
            p->mirror_tag[index % p->mirror_slots] = -1;
        }
    }
}

static void mirror_free(cdFile *p) {
    if (p->mirror != NULL)
        OPENSSL_cleanse(p->mirror, (size_t)(p->mirror_slots * p->seg));
    sqlite3_free(p->mirror);
    sqlite3_free(p->mirror_nonce);
    sqlite3_free(p->mirror_tag);
    sqlite3_free(p->mirror_len);
    p->mirror = NULL;
    p->mirror_nonce = NULL;
    p->mirror_tag = NULL;
    p->mirror_len = NULL;
}

/* [offset, offset + amount) from the mirror, if it spans at most two segments this file
 * sealed and the records on disk are still those (one read of their nonces); 1 on success. */
static int cd_mirror_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset) {
    sqlite3_int64 seg = p->seg, first = offset / seg, last = (offset + amount - 1) / seg, got, pos = 0;
    if (p->mirror == NULL || amount <= 0 || last - first > 1)
        return 0;
    for (sqlite3_int64 i = first; i <= last; i++) {
        sqlite3_int64 slot = i % p->mirror_slots;
        sqlite3_int64 need = i < last ? seg : offset + amount - i * seg;
        if (p->mirror_tag[slot] != i || p->mirror_len[slot] < need)
            return 0;
    }
    if (raw_read(p, p->rbuf, (last - first) * p->rec + NONCE, HEADER_SIZE + first * p->rec, &got) != SQLITE_OK ||
        got != (last - first) * p->rec + NONCE)
        return 0;
    for (sqlite3_int64 i = first; i <= last; i++) {
        if (memcmp(p->rbuf + (i - first) * p->rec, p->mirror_nonce + (i % p->mirror_slots) * NONCE, NONCE) != 0)
            return 0;
    }
    for (sqlite3_int64 i = first; i <= last; i++) {
        sqlite3_int64 lo = i == first ? offset % seg : 0;
        sqlite3_int64 hi = i == last ? offset + amount - i * seg : seg;
        memcpy(buf + pos, p->mirror + (i % p->mirror_slots) * seg + lo, (size_t)(hi - lo));
        pos += hi - lo;
    }
    return 1;
}

/* Is the cached last segment still the one on disk? One 16-byte read of its nonce (each
 * write draws a fresh random nonce, so another writer's record has another nonce). A
 * partial segment is the last of its file, and nobody can append past it without
 * rewriting it, so while it is intact the file's size is known too. */
static int cd_cached_tail(cdFile *p, sqlite3_int64 index) {
    unsigned char nonce[NONCE];
    sqlite3_int64 got;
    if (!p->tc_valid || index != p->tc_index)
        return 0;
    if (raw_read(p, nonce, NONCE, HEADER_SIZE + index * p->rec, &got) == SQLITE_OK && got == NONCE &&
        memcmp(nonce, p->tc_rec, NONCE) == 0)
        return 1;
    p->tc_valid = 0;
    return 0;
}

/* Seal the segments [offset, offset + n) touches and write them with one write.
 * cached: the first segment is the cached tail (cd_cached_tail said so). */
static int cd_write_range_c(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset,
                            sqlite3_int64 size, int cached);

static int cd_write_range(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset, sqlite3_int64 size) {
    return cd_write_range_c(p, data, n, offset, size, 0);
}

static int cd_write_range_c(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset,
                            sqlite3_int64 size, int cached) {
    sqlite3_int64 seg = p->seg, rec = p->rec, pos = 0, used = 0;
    sqlite3_int64 first = offset / seg, count = (offset + n - 1) / seg - first + 1;
    sqlite3_int64 new_tail = -1; /* index of a partial last segment this write leaves */
    int rc;
    if (n <= 0)
        return SQLITE_OK;
    if (p->tc_plain != NULL && p->tc_index >= first && p->tc_index < first + count)
        p->tc_valid = 0; /* rewritten below (or the write fails): no longer what is on disk */
    if (p->batch_cap < count * rec) {
        unsigned char *b = sqlite3_realloc64(p->batch, (sqlite3_uint64)(count * rec));
        if (b == NULL)
            return SQLITE_NOMEM;
        p->batch = b;
        p->batch_cap = count * rec;
    }
    while (pos < n) {
        sqlite3_int64 index = (offset + pos) / seg, lo = (offset + pos) % seg;
        sqlite3_int64 take = seg - lo < n - pos ? seg - lo : n - pos;
        sqlite3_int64 old_len = size - index * seg;
        const unsigned char *plain;
        sqlite3_int64 plen;
        old_len = old_len < 0 ? 0 : (old_len > seg ? seg : old_len);
        if (lo == 0 && take >= old_len) {
            plain = data + pos;
            plen = take;
        } else if (lo == 0 && p->kind == KIND_WAL && offset + n >= p->wal_high) {
            memcpy(p->plain, data + pos, (size_t)take); /* what follows is an older generation's */
            memset(p->plain + take, 0, (size_t)(old_len - take));
            plain = p->plain;
            plen = old_len;
        } else {
            sqlite3_int64 got = 0, end;
            const unsigned char *old_rec = p->rbuf;
            sqlite3_int64 old_rec_len;
            if (cached && index == first && old_len == p->tc_len) { /* the tail this file wrote last */
                memcpy(p->plain, p->tc_plain, (size_t)old_len);
                got = old_len;
                old_rec = p->tc_rec;
                old_rec_len = old_len + OVERHEAD;
            } else {
                if (old_len) {
                    rc = cd_decrypt(p, index, p->plain, &got);
                    if (rc != SQLITE_OK)
                        return rc;
                }
                old_rec_len = p->rec_len;
            }
            if (got != old_len) {
                p->fail_index = index;
                return CD_AUTH;
            }
            if (lo && p->tail_path != NULL) {
                /* bytes before lo may be committed: keep the old record until the new one is on disk */
                if ((rc = tail_save(p, index, old_rec, old_rec_len)) != SQLITE_OK)
                    return rc;
            }
            end = old_len > lo + take ? old_len : lo + take;
            if (end > old_len)
                memset(p->plain + old_len, 0, (size_t)(end - old_len));
            memcpy(p->plain + lo, data + pos, (size_t)take);
            plain = p->plain;
            plen = end;
        }
        sqlite3_int64 slot = (index - first) * rec;
        if ((rc = cd_seal(p, index, plain, (int)plen, p->batch + slot)) != SQLITE_OK)
            return rc;
        mirror_put(p, index, plain, plen, p->batch + slot);
        used = slot + plen + OVERHEAD;
        pos += take;
        if (pos >= n && (plen < seg || (offset + n) % seg) && p->tc_plain != NULL) {
            memcpy(p->tc_plain, plain, (size_t)plen);
            memcpy(p->tc_rec, p->batch + slot, (size_t)(plen + OVERHEAD));
            p->tc_len = plen;
            new_tail = index;
        }
    }
    if ((rc = raw_write(p, p->batch, used, HEADER_SIZE + first * rec)) != SQLITE_OK)
        return rc;
    if (new_tail >= 0) {
        p->tc_index = new_tail;
        p->tc_valid = 1;
    }
    if (offset == 0)
        p->wal_high = n; /* SQLite wrote the WAL header: a new generation */
    else if (offset + n > p->wal_high)
        p->wal_high = offset + n;
    return SQLITE_OK;
}

static int cd_write_zeros(cdFile *p, sqlite3_int64 n, sqlite3_int64 offset, sqlite3_int64 size) {
    int rc;
    unsigned char *zeros;
    if (n <= 0)
        return SQLITE_OK;
    zeros = sqlite3_malloc64((sqlite3_uint64)n);
    if (zeros == NULL)
        return SQLITE_NOMEM;
    memset(zeros, 0, (size_t)n);
    rc = cd_write_range(p, zeros, n, offset, size);
    sqlite3_free(zeros);
    return rc;
}

static int cd_encrypt_write(cdFile *p, sqlite3_int64 index, const unsigned char *plain, sqlite3_int64 n) {
    int rc;
    if (index == p->tc_index)
        p->tc_valid = 0;
    mirror_drop(p, index);
    rc = cd_seal(p, index, plain, (int)n, p->rbuf);
    if (rc != SQLITE_OK)
        return rc;
    return raw_write(p, p->rbuf, n + OVERHEAD, HEADER_SIZE + index * p->rec);
}

static int cd_write(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset) {
    sqlite3_int64 seg = p->seg, index = offset / seg, lo = offset % seg, size;
    int rc;
    if (lo == 0 && n == seg) { /* the page fast path: one whole segment */
        if (offset > 0) {
            sqlite3_int64 raw;
            if ((rc = raw_size(p, &raw)) != SQLITE_OK)
                return rc;
            if (raw < HEADER_SIZE + index * p->rec) {
                if ((rc = cd_size(p, &size)) != SQLITE_OK)
                    return rc;
                if (offset > size && (rc = cd_write_zeros(p, offset - size, size, size)) != SQLITE_OK)
                    return rc;
            }
        }
        return cd_encrypt_write(p, index, data, n);
    }
    int cached = cd_cached_tail(p, index);
    if (cached && p->tc_len < seg && offset <= index * seg + p->tc_len) {
        size = index * seg + p->tc_len; /* a partial segment is the file's last */
    } else if ((rc = cd_size(p, &size)) != SQLITE_OK) {
        return rc;
    }
    if (offset > size) {
        if ((rc = cd_write_zeros(p, offset - size, size, size)) != SQLITE_OK)
            return rc;
        size = offset;
        cached = cd_cached_tail(p, index);
    }
    return cd_write_range_c(p, data, n, offset, size, cached);
}

static int cd_truncate_store(cdFile *p, sqlite3_int64 size) {
    sqlite3_int64 current, seg = p->seg, count, rest, got;
    int rc;
    p->tc_valid = 0;
    mirror_drop(p, -1);
    if (size < p->wal_high)
        p->wal_high = size;
    if ((rc = cd_size(p, &current)) != SQLITE_OK)
        return rc;
    if (size >= current) {
        if (size > current)
            return cd_write_zeros(p, size - current, current, current);
        if (size % seg == 0) {
            sqlite3_int64 raw, target = HEADER_SIZE + size / seg * p->rec;
            if ((rc = raw_size(p, &raw)) != SQLITE_OK)
                return rc;
            if (raw > target)
                return p->real->pMethods->xTruncate(p->real, target); /* drop a cut record */
        }
        return SQLITE_OK;
    }
    count = size / seg;
    rest = size % seg;
    if (rest) {
        if ((rc = cd_decrypt(p, count, p->plain, &got)) != SQLITE_OK)
            return rc;
        if (got < rest) {
            p->fail_index = count;
            return CD_AUTH;
        }
        if (p->tail_path != NULL && (rc = tail_save(p, count, p->rbuf, p->rec_len)) != SQLITE_OK)
            return rc;
        if ((rc = p->real->pMethods->xTruncate(p->real, HEADER_SIZE + count * p->rec)) != SQLITE_OK)
            return rc;
        return cd_encrypt_write(p, count, p->plain, rest);
    }
    return p->real->pMethods->xTruncate(p->real, HEADER_SIZE + count * p->rec);
}

/* -- headers (through Python, which holds the keys) ------------------------ */

static void cd_free_store(cdFile *p) {
    if (p->enc)
        EVP_CIPHER_CTX_free(p->enc);
    if (p->dec)
        EVP_CIPHER_CTX_free(p->dec);
    p->enc = p->dec = NULL;
    if (p->plain)
        OPENSSL_cleanse(p->plain, (size_t)p->seg);
    if (p->plain2)
        OPENSSL_cleanse(p->plain2, (size_t)p->seg);
    if (p->tc_plain)
        OPENSSL_cleanse(p->tc_plain, (size_t)p->seg);
    sqlite3_free(p->tc_plain);
    sqlite3_free(p->tc_rec);
    p->tc_plain = p->tc_rec = NULL;
    p->tc_valid = 0;
    mirror_free(p);
    sqlite3_free(p->rbuf);
    sqlite3_free(p->plain);
    sqlite3_free(p->plain2);
    sqlite3_free(p->batch);
    p->rbuf = p->plain = p->plain2 = p->batch = NULL;
    p->batch_cap = 0;
    p->loaded = 0;
}

static int cd_setup(cdFile *p, const unsigned char *header, const unsigned char *dek, Py_ssize_t deklen) {
    const EVP_CIPHER *cipher = deklen == 32 ? EVP_aes_256_gcm() : EVP_aes_128_gcm();
    int log2 = header[11];
    if ((deklen != 32 && deklen != 16) || log2 < 9 || log2 > 24)
        return SQLITE_CORRUPT;
    p->seg = (sqlite3_int64)1 << log2;
    p->rec = p->seg + OVERHEAD;
    memcpy(p->ad, header + 16, 16);
    p->enc = EVP_CIPHER_CTX_new();
    p->dec = EVP_CIPHER_CTX_new();
    p->rbuf = sqlite3_malloc64((sqlite3_uint64)(2 * p->rec));
    p->plain = sqlite3_malloc64((sqlite3_uint64)p->seg);
    p->plain2 = sqlite3_malloc64((sqlite3_uint64)p->seg);
    p->tc_valid = 0;
    p->tc_index = -1;
    p->wal_high = INT64_MAX; /* until SQLite starts the WAL over, every byte may be needed */
    if (p->gather) {
        p->tc_plain = sqlite3_malloc64((sqlite3_uint64)p->seg);
        p->tc_rec = sqlite3_malloc64((sqlite3_uint64)p->rec);
        if (!p->tc_plain || !p->tc_rec) {
            cd_free_store(p);
            return SQLITE_NOMEM;
        }
    }
    if (!p->enc || !p->dec || !p->rbuf || !p->plain || !p->plain2 ||
        EVP_EncryptInit_ex(p->enc, cipher, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(p->enc, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) != 1 ||
        EVP_EncryptInit_ex(p->enc, NULL, NULL, dek, NULL) != 1 ||
        EVP_DecryptInit_ex(p->dec, cipher, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(p->dec, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) != 1 ||
        EVP_DecryptInit_ex(p->dec, NULL, NULL, dek, NULL) != 1) {
        cd_free_store(p);
        return SQLITE_NOMEM;
    }
    p->loaded = 1;
    return SQLITE_OK;
}

/* Call header_for(path, header or None, segment size); set up the store from its answer. */
static int cd_call_header(cdFile *p, const unsigned char *header, sqlite3_int64 hlen, sqlite3_int64 seg, int write_it) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r;
    int rc = SQLITE_CANTOPEN;
    if (header != NULL)
        r = PyObject_CallFunction(p->vfs->header_for, "sy#L", p->path, (const char *)header,
                                  (Py_ssize_t)hlen, (long long)seg);
    else
        r = PyObject_CallFunction(p->vfs->header_for, "sOL", p->path, Py_None, (long long)seg);
    if (r != NULL) {
        const char *h = NULL, *dek = NULL;
        Py_ssize_t hl = 0, dl = 0;
        if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 &&
            PyBytes_AsStringAndSize(PyTuple_GET_ITEM(r, 0), (char **)&h, &hl) == 0 &&
            PyBytes_AsStringAndSize(PyTuple_GET_ITEM(r, 1), (char **)&dek, &dl) == 0 && hl == HEADER_SIZE) {
            rc = SQLITE_OK;
            if (write_it)
                rc = raw_write(p, (const unsigned char *)h, HEADER_SIZE, 0);
            if (rc == SQLITE_OK)
                rc = cd_setup(p, (const unsigned char *)h, (const unsigned char *)dek, dl);
        } else if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "header_for must return (header, dek)");
        }
        Py_DECREF(r);
    }
    /* on failure the exception stays pending: apsw raises it (WrongKeyError, ...) */
    PyGILState_Release(g);
    return rc;
}

/* Open the store if the file has a header (another process may have written it). */
static int cd_load(cdFile *p) {
    sqlite3_int64 size, got;
    unsigned char header[HEADER_SIZE];
    int rc;
    if (p->loaded)
        return SQLITE_OK;
    if ((rc = raw_size(p, &size)) != SQLITE_OK)
        return rc;
    if (size == 0)
        return SQLITE_OK;
    if ((rc = raw_read(p, header, HEADER_SIZE, 0, &got)) != SQLITE_OK)
        return rc;
    return cd_call_header(p, header, got, 0, 0);
}

static sqlite3_int64 pow2_segment(sqlite3_int64 n) {
    sqlite3_int64 v = 512;
    while (v < n && v < 65536)
        v <<= 1;
    return v;
}

static unsigned be(const unsigned char *b, int n) {
    unsigned v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | b[i];
    return v;
}

/* The segment size for a new file, from the first bytes SQLite writes (as segment_size_for). */
static sqlite3_int64 segment_size_for(int kind, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset) {
    static const unsigned char journal_magic[8] = {0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7};
    sqlite3_int64 page = 0;
    if (kind == KIND_MAIN && offset == 0 && n >= 18 && memcmp(first, "SQLite format 3", 16) == 0) {
        unsigned raw = be(first + 16, 2);
        page = raw == 1 ? 65536 : raw;
    } else if (kind == KIND_MAIN && offset == 0) {
        page = n;
    } else if (kind == KIND_WAL && offset == 0 && n >= 12 && first[0] == 0x37 && first[1] == 0x7f && first[2] == 0x06) {
        page = be(first + 8, 4);
    } else if (kind == KIND_JOURNAL && offset == 0 && n >= 28 && memcmp(first, journal_magic, 8) == 0) {
        page = be(first + 24, 4);
    }
    if (page && (page & (page - 1)) == 0 && page >= 512 && page <= 65536)
        return page;
    return page == 0 ? 4096 : pow2_segment(page);
}

static int cd_create(cdFile *p, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset) {
    int rc = cd_load(p);
    if (rc != SQLITE_OK || p->loaded)
        return rc;
    return cd_call_header(p, NULL, 0, segment_size_for(p->kind, first, n, offset), 1);
}

/* -- gathering journal and WAL writes -------------------------------------- */

static int cd_flush(cdFile *p) {
    int rc;
    if (p->pend_len == 0)
        return SQLITE_OK;
    if (!p->loaded && (rc = cd_create(p, p->pend, p->pend_len, p->pend_start)) != SQLITE_OK)
        return rc;
    if ((rc = cd_write(p, p->pend, p->pend_len, p->pend_start)) != SQLITE_OK)
        return rc;
    p->pend_start += p->pend_len;
    p->pend_len = 0;
    return SQLITE_OK;
}

static int cd_append(cdFile *p, const unsigned char *data, sqlite3_int64 n) {
    if (p->pend_len + n > p->pend_cap) {
        sqlite3_int64 cap = p->pend_cap ? p->pend_cap : 65536;
        while (cap < p->pend_len + n)
            cap *= 2;
        unsigned char *b = sqlite3_realloc64(p->pend, (sqlite3_uint64)cap);
        if (b == NULL)
            return SQLITE_NOMEM;
        p->pend = b;
        p->pend_cap = cap;
    }
    memcpy(p->pend + p->pend_len, data, (size_t)n);
    p->pend_len += n;
    return SQLITE_OK;
}

static int cd_flush_journal(cdFile *p) {
    cdFile *j;
    if (p->vfs->journals == NULL)
        return SQLITE_OK;
    pthread_mutex_lock(&p->vfs->lock);
    for (j = p->vfs->journals; j != NULL; j = j->next_journal)
        if (j->journal_of == p->path) /* this connection's journal */
            break;
    if (j == NULL) /* names copied by a VFS shim above this one: match by path */
        for (j = p->vfs->journals; j != NULL; j = j->next_journal)
            if (strcmp(j->journal_of_copy, p->path) == 0)
                break;
    pthread_mutex_unlock(&p->vfs->lock);
    return j != NULL && j->pend_len ? cd_flush(j) : SQLITE_OK;
}

/* Internal result to SQLite's: CD_AUTH becomes PageAuthenticationError. */
static int cd_result(cdFile *p, int rc) {
    return rc == CD_AUTH ? cd_auth_error(p) : rc;
}

/* -- io methods -------------------------------------------------------------- */

static int x_close(sqlite3_file *f) {
    cdFile *p = (cdFile *)f;
    int rc = cd_result(p, cd_flush(p));
    if (p->journal_of != NULL) {
        cdFile **link;
        pthread_mutex_lock(&p->vfs->lock);
        for (link = &p->vfs->journals; *link != NULL; link = &(*link)->next_journal)
            if (*link == p) {
                *link = p->next_journal;
                break;
            }
        pthread_mutex_unlock(&p->vfs->lock);
        sqlite3_free(p->journal_of_copy);
        p->journal_of_copy = NULL;
        p->journal_of = NULL;
    }
    if (p->tail_map != NULL)
        munmap(p->tail_map, (size_t)(16 + p->rec));
    p->tail_map = NULL;
    if (p->tail_fd >= 0)
        close(p->tail_fd);
    p->tail_fd = -1;
    sqlite3_free(p->tail_path);
    p->tail_path = NULL;
    cd_free_store(p);
    if (p->pend) {
        OPENSSL_cleanse(p->pend, (size_t)p->pend_cap);
        sqlite3_free(p->pend);
        p->pend = NULL;
    }
    int rc2 = p->real->pMethods ? p->real->pMethods->xClose(p->real) : SQLITE_OK;
    return rc != SQLITE_OK ? rc : rc2;
}

static int check_length(cdFile *p, const unsigned char *page1, sqlite3_int64 got) {
    sqlite3_int64 page, pages, size;
    unsigned raw;
    int rc;
    if (got < 100 || memcmp(page1, "SQLite format 3", 16) != 0 || memcmp(page1 + 24, page1 + 92, 4) != 0)
        return SQLITE_OK; /* the in-header size is only valid when these counters agree */
    if (page1[18] == 2)
        return SQLITE_OK; /* WAL mode: the file legitimately lags the WAL */
    raw = be(page1 + 16, 2);
    page = raw == 1 ? 65536 : raw;
    if (page != got)
        return SQLITE_OK;
    pages = be(page1 + 28, 4);
    if ((rc = cd_size(p, &size)) != SQLITE_OK)
        return rc;
    if (pages * page > size) {
        sqlite3_int64 where = HEADER_SIZE + (size / p->seg) * p->rec;
        return cd_raise(p, ERR_TRUNCATED, where,
                        "%s: file is truncated: its header says %lld pages of %lld bytes but the file holds %lld",
                        p->path, (long long)pages, (long long)page, (long long)(size / page));
    }
    return SQLITE_OK;
}

static int x_read(sqlite3_file *f, void *buf, int amount, sqlite3_int64 offset) {
    cdFile *p = (cdFile *)f;
    sqlite3_int64 got = 0;
    int rc;
    if (p->pend_len && (rc = cd_result(p, cd_flush(p))) != SQLITE_OK)
        return rc;
    if (!p->loaded && (rc = cd_load(p)) != SQLITE_OK)
        return rc == SQLITE_CANTOPEN ? SQLITE_IOERR_READ : rc;
    if (!p->loaded) {
        memset(buf, 0, (size_t)amount);
        return SQLITE_IOERR_SHORT_READ;
    }
    if (offset == 0 && p->kind == KIND_MAIN && amount < p->seg) {
        /* the peek at open: zeros (never the bytes) if page 1 was cut mid-write by a crash */
        rc = cd_read(p, buf, amount, 0, &got);
        if (rc == CD_AUTH) {
            cd_warn(p, "%s: page 1 does not authenticate at open (a write cut by a crash?); SQLite sees "
                    "zeros until it rolls back its journal", p->path);
            memset(buf, 0, (size_t)amount);
            return SQLITE_OK;
        }
    } else {
        rc = cd_read(p, buf, amount, offset, &got);
        if (rc == SQLITE_OK && offset == 0 && p->kind == KIND_MAIN && amount >= 512)
            rc = check_length(p, buf, got);
    }
    if (rc != SQLITE_OK)
        return cd_result(p, rc);
    if (got < amount) {
        memset((unsigned char *)buf + got, 0, (size_t)(amount - got));
        return SQLITE_IOERR_SHORT_READ;
    }
    return SQLITE_OK;
}

static int x_write(sqlite3_file *f, const void *vdata, int n, sqlite3_int64 offset) {
    cdFile *p = (cdFile *)f;
    const unsigned char *data = vdata;
    int rc, appended;
    if (!p->gather) {
        if ((rc = cd_flush_journal(p)) != SQLITE_OK)
            return cd_result(p, rc);
        if (!p->loaded && (rc = cd_create(p, data, n, offset)) != SQLITE_OK)
            return rc;
        return cd_result(p, cd_write(p, data, n, offset));
    }
    appended = offset == p->pend_start + p->pend_len;
    if (appended) {
        rc = cd_append(p, data, n);
    } else if (p->pend_len && p->pend_start <= offset && offset + n <= p->pend_start + p->pend_len) {
        memcpy(p->pend + (offset - p->pend_start), data, (size_t)n);
        rc = SQLITE_OK;
    } else {
        if (p->pend_len && (rc = cd_flush(p)) != SQLITE_OK)
            return cd_result(p, rc);
        p->pend_start = offset;
        rc = cd_append(p, data, n);
    }
    if (rc != SQLITE_OK)
        return rc;
    if (n == 24 && p->kind == KIND_WAL) {
        /* a frame header: from a commit frame's header to the next transaction's first frame, write through */
        p->write_through = data[4] | data[5] | data[6] | data[7];
        if (p->write_through && !appended)
            return cd_result(p, cd_flush(p));
    } else if (p->write_through || p->pend_len >= FLUSH_AT) {
        return cd_result(p, cd_flush(p));
    }
    return SQLITE_OK;
}

static int x_truncate(sqlite3_file *f, sqlite3_int64 size) {
    cdFile *p = (cdFile *)f;
    int rc = p->pend_len ? cd_flush(p) : (!p->gather ? cd_flush_journal(p) : SQLITE_OK);
    if (rc != SQLITE_OK)
        return cd_result(p, rc);
    if (!p->loaded && (rc = cd_load(p)) != SQLITE_OK)
        return rc;
    if (!p->loaded) {
        if (size == 0)
            return SQLITE_OK;
        if ((rc = cd_create(p, (const unsigned char *)"", 0, 0)) != SQLITE_OK)
            return rc;
    }
    return cd_result(p, cd_truncate_store(p, size));
}

static int x_sync(sqlite3_file *f, int flags) {
    cdFile *p = (cdFile *)f;
    int rc = p->pend_len ? cd_flush(p) : (!p->gather ? cd_flush_journal(p) : SQLITE_OK);
    if (rc != SQLITE_OK)
        return cd_result(p, rc);
    if (p->anonymous)
        return SQLITE_OK; /* an unnamed temporary file: nothing to make durable */
    return p->real->pMethods->xSync(p->real, flags);
}

static int x_file_size(sqlite3_file *f, sqlite3_int64 *size) {
    cdFile *p = (cdFile *)f;
    int rc;
    if (p->pend_len && (rc = cd_result(p, cd_flush(p))) != SQLITE_OK)
        return rc;
    if (!p->loaded && (rc = cd_load(p)) != SQLITE_OK)
        return rc == SQLITE_CANTOPEN ? SQLITE_IOERR_FSTAT : rc;
    if (!p->loaded) {
        *size = 0;
        return SQLITE_OK;
    }
    return cd_size(p, size);
}

static int x_lock(sqlite3_file *f, int level) {
    cdFile *p = (cdFile *)f;
    return p->real->pMethods->xLock(p->real, level);
}

static int x_unlock(sqlite3_file *f, int level) {
    cdFile *p = (cdFile *)f;
    return p->real->pMethods->xUnlock(p->real, level);
}

static int x_check_reserved_lock(sqlite3_file *f, int *out) {
    cdFile *p = (cdFile *)f;
    return p->real->pMethods->xCheckReservedLock(p->real, out);
}

static int x_file_control(sqlite3_file *f, int op, void *arg) {
    cdFile *p = (cdFile *)f;
    switch (op) {
    case SQLITE_FCNTL_MMAP_SIZE: /* SQLite must read pages through the VFS to decrypt them */
        *(sqlite3_int64 *)arg = 0;
        return SQLITE_OK;
    case SQLITE_FCNTL_VFSNAME: { /* "cryptdisk-c-N/unix", as VFS shims report themselves */
        int rc = p->real->pMethods->xFileControl(p->real, op, arg);
        char *inner = rc == SQLITE_OK ? *(char **)arg : NULL;
        *(char **)arg = inner ? sqlite3_mprintf("%s/%z", p->vfs->name, inner) : sqlite3_mprintf("%s", p->vfs->name);
        return SQLITE_OK;
    }
    case SQLITE_FCNTL_CHUNK_SIZE: /* would grow the raw file with zeros */
    case SQLITE_FCNTL_SIZE_HINT:
        return SQLITE_OK;
    default:
        return p->real->pMethods->xFileControl(p->real, op, arg);
    }
}

static int x_sector_size(sqlite3_file *f) {
    cdFile *p = (cdFile *)f;
    return p->loaded ? (int)p->seg : 512;
}

static int x_device_characteristics(sqlite3_file *f) {
    (void)f;
    return 0; /* no atomic writes, no powersafe overwrite: segments are shared */
}

static int x_shm_map(sqlite3_file *f, int region, int size, int extend, void volatile **out) {
    cdFile *p = (cdFile *)f;
    return p->real->pMethods->xShmMap(p->real, region, size, extend, out);
}

static int x_shm_lock(sqlite3_file *f, int offset, int n, int flags) {
    cdFile *p = (cdFile *)f;
    return p->real->pMethods->xShmLock(p->real, offset, n, flags);
}

static void x_shm_barrier(sqlite3_file *f) {
    cdFile *p = (cdFile *)f;
    p->real->pMethods->xShmBarrier(p->real);
}

static int x_shm_unmap(sqlite3_file *f, int delete_flag) {
    cdFile *p = (cdFile *)f;
    return p->real->pMethods->xShmUnmap(p->real, delete_flag);
}

static const sqlite3_io_methods cd_io = {
    2, /* shared memory, no xFetch: SQLite never maps ciphertext */
    x_close, x_read, x_write, x_truncate, x_sync, x_file_size, x_lock, x_unlock,
    x_check_reserved_lock, x_file_control, x_sector_size, x_device_characteristics,
    x_shm_map, x_shm_lock, x_shm_barrier, x_shm_unmap, NULL, NULL,
};

/* -- vfs methods ------------------------------------------------------------- */

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    cdVfs *v = (cdVfs *)vfs;
    cdFile *p = (cdFile *)f;
    int rc;
    memset(p, 0, sizeof *p);
    p->real = (sqlite3_file *)&p[1];
    p->vfs = v;
    p->tail_fd = -1;
    rc = v->root->xOpen(v->root, name, p->real, flags, out_flags);
    if (rc != SQLITE_OK)
        return rc;
    if (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_TEMP_DB | SQLITE_OPEN_TRANSIENT_DB))
        p->kind = KIND_MAIN;
    else if (flags & SQLITE_OPEN_WAL)
        p->kind = KIND_WAL;
    else if (flags & SQLITE_OPEN_MAIN_JOURNAL)
        p->kind = KIND_JOURNAL;
    else
        p->kind = KIND_TEMP;
    p->anonymous = name == NULL;
    p->path = name ? name : "<temporary file>";
    p->gather = p->kind != KIND_MAIN;
    p->base.pMethods = &cd_io;
    if (name != NULL && (p->kind == KIND_JOURNAL || p->kind == KIND_WAL)) {
        p->torn_as_hole = 1;
        p->tail_path = sqlite3_mprintf("%s%s", name, TAIL_SUFFIX);
        if (p->tail_path == NULL) {
            x_close(f);
            p->base.pMethods = NULL;
            return SQLITE_NOMEM;
        }
    }
    if (name != NULL && p->kind == KIND_JOURNAL && has_suffix(name, "-journal")) {
        /* SQLITE_OPEN_MAIN_JOURNAL: the pager allocated this name after its database's, so
         * sqlite3_filename_database gives the database file's own name pointer. A name that
         * did not come from a pager (a VFS shim above this one copied it) is matched by path. */
        size_t n = strlen(name) - strlen("-journal");
        const char *db = sqlite3_filename_database(name);
        p->journal_of_copy = sqlite3_mprintf("%.*s", (int)n, name);
        if (p->journal_of_copy == NULL) {
            x_close(f);
            p->base.pMethods = NULL;
            return SQLITE_NOMEM;
        }
        p->journal_of = db != NULL && strcmp(db, p->journal_of_copy) == 0 ? db : p->journal_of_copy;
        pthread_mutex_lock(&v->lock);
        p->next_journal = v->journals;
        v->journals = p;
        pthread_mutex_unlock(&v->lock);
    }
    if ((rc = cd_load(p)) != SQLITE_OK) {
        x_close(f);
        p->base.pMethods = NULL;
        return rc;
    }
    return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *vfs, const char *name, int syncdir) {
    cdVfs *v = (cdVfs *)vfs;
    int rc = v->root->xDelete(v->root, name, syncdir);
    if (has_suffix(name, "-journal") || has_suffix(name, "-wal")) {
        char *tail = sqlite3_mprintf("%s%s", name, TAIL_SUFFIX);
        if (tail != NULL) {
            unlink(tail);
            sqlite3_free(tail);
        }
    }
    return rc;
}

#define ROOT(vfs) (((cdVfs *)(vfs))->root)
static int v_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
    return ROOT(vfs)->xAccess(ROOT(vfs), name, flags, out);
}
static int v_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out) {
    return ROOT(vfs)->xFullPathname(ROOT(vfs), name, n, out);
}
static void *v_dlopen(sqlite3_vfs *vfs, const char *name) { return ROOT(vfs)->xDlOpen(ROOT(vfs), name); }
static void v_dlerror(sqlite3_vfs *vfs, int n, char *out) { ROOT(vfs)->xDlError(ROOT(vfs), n, out); }
static void (*v_dlsym(sqlite3_vfs *vfs, void *h, const char *sym))(void) {
    return ROOT(vfs)->xDlSym(ROOT(vfs), h, sym);
}
static void v_dlclose(sqlite3_vfs *vfs, void *h) { ROOT(vfs)->xDlClose(ROOT(vfs), h); }
static int v_randomness(sqlite3_vfs *vfs, int n, char *out) { return ROOT(vfs)->xRandomness(ROOT(vfs), n, out); }
static int v_sleep(sqlite3_vfs *vfs, int us) { return ROOT(vfs)->xSleep(ROOT(vfs), us); }
static int v_current_time(sqlite3_vfs *vfs, double *out) { return ROOT(vfs)->xCurrentTime(ROOT(vfs), out); }
static int v_get_last_error(sqlite3_vfs *vfs, int n, char *out) {
    return ROOT(vfs)->xGetLastError ? ROOT(vfs)->xGetLastError(ROOT(vfs), n, out) : 0;
}
static int v_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
    return ROOT(vfs)->xCurrentTimeInt64(ROOT(vfs), out);
}

/* -- Python module ------------------------------------------------------------ */

static PyObject *py_ready(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(sqlite3_api != NULL);
}

static PyObject *py_register(PyObject *self, PyObject *args) {
    const char *name;
    PyObject *header_for, *raiser, *warner;
    sqlite3_vfs *root;
    cdVfs *v;
    (void)self;
    if (!PyArg_ParseTuple(args, "sOOO", &name, &header_for, &raiser, &warner))
        return NULL;
    if (sqlite3_api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "load this module into SQLite first (sqlite3_cvfs_init)");
        return NULL;
    }
    if (strlen(name) >= sizeof v->name) {
        PyErr_SetString(PyExc_ValueError, "VFS name too long");
        return NULL;
    }
    root = sqlite3_vfs_find(NULL);
    if (root == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SQLite has no default VFS");
        return NULL;
    }
    v = PyMem_RawCalloc(1, sizeof *v);
    if (v == NULL)
        return PyErr_NoMemory();
    strcpy(v->name, name);
    pthread_mutex_init(&v->lock, NULL);
    v->root = root;
    Py_INCREF(header_for);
    Py_INCREF(raiser);
    Py_INCREF(warner);
    v->header_for = header_for;
    v->raiser = raiser;
    v->warner = warner;
    v->base.iVersion = root->iVersion < 2 ? root->iVersion : 2;
    v->base.szOsFile = (int)sizeof(cdFile) + root->szOsFile;
    v->base.mxPathname = root->mxPathname;
    v->base.zName = v->name;
    v->base.pAppData = NULL;
    v->base.xOpen = v_open;
    v->base.xDelete = v_delete;
    v->base.xAccess = v_access;
    v->base.xFullPathname = v_full_pathname;
    v->base.xDlOpen = v_dlopen;
    v->base.xDlError = v_dlerror;
    v->base.xDlSym = v_dlsym;
    v->base.xDlClose = v_dlclose;
    v->base.xRandomness = v_randomness;
    v->base.xSleep = v_sleep;
    v->base.xCurrentTime = v_current_time;
    v->base.xGetLastError = v_get_last_error;
    v->base.xCurrentTimeInt64 = v_current_time_int64;
    /* registered for the life of the process, like SQLite's own VFSes */
    if (sqlite3_vfs_register(&v->base, 0) != SQLITE_OK) {
        PyErr_SetString(PyExc_RuntimeError, "sqlite3_vfs_register failed");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return Py_BuildValue("{sKsKsKsK}", "sealed", n_seal, "sealed_bytes", n_seal_bytes, "opened",
                         n_unseal, "opened_bytes", n_unseal_bytes);
}

static PyMethodDef methods[] = {
    {"stats", py_stats, METH_NOARGS, "Records sealed and opened by this process, and their bytes."},
    {"ready", py_ready, METH_NOARGS, "True once SQLite has loaded this module as an extension."},
    {"register", py_register, METH_VARARGS,
     "register(name, header_for, raiser, warner): register an encrypting VFS with SQLite."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cvfs", "The encrypting SQLite VFS, in C.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cvfs(void) { return PyModule_Create(&module); }

/* The SQLite loadable-extension entry point: keep SQLite's routines for the VFS. */
__attribute__((visibility("default"))) int sqlite3_cvfs_init(sqlite3 *db, char **errmsg, const sqlite3_api_routines *api) {
    (void)db;
    (void)errmsg;
    sqlite3_api = api;
    return SQLITE_OK_LOAD_PERMANENTLY;
}
