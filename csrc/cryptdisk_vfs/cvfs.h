/*
 * cryptdisk.sqlite._cvfs: the encrypting SQLite VFS, in C. This header is what its files
 * share: cipher.c (records), rawio.c (raw I/O, side file), store.c (plaintext over
 * records), file.c (one open file and its io methods), shm.c (the wal-index), vfs.c (VFS
 * methods, Python module).
 *
 * The same files, byte for byte, as the Python VFS (_vfs.py over format/_mutable.py's
 * MutableStore; cryptdisk's mutable and framed formats, docs/format.md): header(128) ||
 * record*, each record nonce(16) || AES-GCM(DEK, nonce, plaintext, file_id ||
 * u64le(index)) || tag(16), a fresh random nonce on every write. Database files
 * are mutable (a segment per page); WALs and rollback journals are framed (a
 * segment per WAL frame or journal record, after the WAL or journal header). The Python VFS is the
 * reference; this one exists because SQLite calls a VFS several times per
 * transaction and each call into Python costs more than the AES-GCM of a page.
 * Behaviour, including everything in docs/sqlite.md about crashes (the
 * -cdtail side file, torn journal/WAL segments read as zeros, the page-1 peek,
 * a cut record at the end), follows _vfs.py and format/_mutable.py; the comments there
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
 * Cipher primitives are libraries': AES-GCM from libgcrypt (or, in a build
 * without it, OpenSSL's EVP; cipher.c), nonces from OpenSSL's RAND_bytes; none is
 * written here. I/O goes through the default VFS's file methods on the raw file, which
 * also does the locking; shm.c keeps the wal-index (which cannot be encrypted) in
 * a memory file system instead of beside the database.
 */
#ifndef CRYPTDISK_VFS_H
#define CRYPTDISK_VFS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sqlite3ext.h>

#include <pthread.h>

#ifdef CD_LIBGCRYPT
#include <gcrypt.h>
typedef gcry_cipher_hd_t cdAead;
#else
#include <openssl/evp.h>
typedef EVP_CIPHER_CTX *cdAead;
#endif

SQLITE_EXTENSION_INIT3

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
#define CD_REREAD (-2) /* internal: header_for asks for the header read again (a rewrap may be writing it) */
#define ERR_AUTH 0
#define ERR_TRUNCATED 1
#define ERR_SHM 2 /* the wal-index cannot be shared (shm.c) */
#define ERR_PAGESIZE 3 /* a page smaller than the file's records (file.c) */
#define TAIL_SUFFIX "-cdtail"
#define WAL_HEADER 32       /* a WAL starts with this many header bytes */
#define WAL_FRAME_HEADER 24 /* then frames of a header and a page */
#define JOURNAL_RECORD_EXTRA 8 /* a journal record: page number, page, checksum */

#define NONCE_POOL 1024 /* nonces drawn per RAND_bytes call (one call costs ~0.7 us for any size to 1 KiB) */
#define RAW_CHUNK 65536 /* the default VFS reads and writes at most 128 KiB per call */

struct cdFile;

/* Records a database file or WAL opened lately (store.c, cd_decrypt). With several
 * connections, SQLite drops a connection's page cache whenever another one committed, and
 * the connection reads its hot pages again (page 1, B-tree roots and inner pages): the same
 * records, byte for byte. An entry remembers a record's index and nonce when it is opened;
 * opened again unchanged, it also keeps the record's bytes and plaintext, and from then on
 * a read whose record is byte for byte the kept one (the whole record compared, not only
 * its nonce) takes the plaintext without AES-GCM: the same plaintext opening it would give.
 * The least recently used entry makes room; a kept plaintext is wiped when it goes. */
#define OPENED 32
typedef struct cdOpened {
    sqlite3_int64 index;
    sqlite3_int64 len;          /* the record's length; 0: an empty entry */
    unsigned long used;         /* when last opened or reused (the file's opened_clock) */
    unsigned char nonce[NONCE]; /* the record's nonce */
    unsigned char *data;        /* NULL (opened once), or the record (len bytes) and its plaintext */
} cdOpened;

#define HEADER_POOL 8 /* journal headers made per call into Python (headers.c) */
#define MAX_DEK 32

/* New journals' headers and data keys, made ahead in one call into Python
 * (cryptdisk.format.new_headers): in DELETE mode every transaction creates a journal, and
 * a cold call into the interpreter costs ~40 us, one header made alone ~7.5 us, one of a
 * batch of 8 ~2.5 us. Each entry is used once, then wiped; all are dropped when
 * the geometry asked for changes or in a forked child (so parent and child never share a
 * data key and file id). */
typedef struct cdHeaderPool {
    unsigned char header[HEADER_POOL][HEADER_SIZE];
    unsigned char dek[HEADER_POOL][MAX_DEK];
    int dek_len[HEADER_POOL];
    int count;
    sqlite3_int64 seg;
    int lead, extra;
    unsigned long generation;
} cdHeaderPool;

typedef struct cdVfs {
    sqlite3_vfs base;
    sqlite3_vfs *root;
    PyObject *header_for; /* (path, header bytes | None, segment size) -> (header, dek) */
    PyObject *raiser;     /* (error code, message, offset, path) -> exception */
    PyObject *warner;     /* (message) -> None */
    pthread_mutex_t lock;
    struct cdFile *journals;
    struct cdFile *mains; /* open (named) database files */
    cdHeaderPool pool;    /* under lock */
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
    cdAead enc; /* AES-GCM under the file's data key (cipher.c) */
    cdAead dec;
    unsigned char ad[24]; /* file_id || u64le(index) */
    unsigned char nonce_pool[NONCE_POOL]; /* random bytes for the next nonces, used once each */
    int nonce_used;
    unsigned long nonce_generation; /* cd_fork_generation when the pool was drawn */
    /* segment geometry (docs/format.md): segment 0 holds lead bytes, later ones seg; a
     * mutable file (kind 2) has lead == seg, a framed WAL (kind 3) lead 32 and seg 24 + page */
    sqlite3_int64 lead;
    sqlite3_int64 seg;
    sqlite3_int64 rec;    /* seg + OVERHEAD: the largest record */
    sqlite3_int64 sector; /* the header's segment size (the page size) */
    int reused;           /* had a header when opened (a journal: no safe append) */
    unsigned char *rbuf;   /* two records */
    unsigned char *plain;  /* one segment */
    unsigned char *plain2; /* one segment */
    unsigned char *batch;
    sqlite3_int64 batch_cap;
    sqlite3_int64 rec_len; /* length of the record in rbuf that last authenticated */
    cdOpened *opened;      /* OPENED entries (database files and WALs, once one opened a record) */
    unsigned long opened_clock;
    sqlite3_int64 fail_index;
    int tail_fd;
    int raw_fd; /* the default VFS's descriptor of the raw file, once raw_size checked it (0: not yet) */
    char *tail_path;
    /* a rewrite whose saved copy is in the side file is not synced yet (tail_save) */
    int tail_pending;
    int tail_dir_synced; /* the side file's directory synced (once per open file) */
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
    /* Database files: publications of the wal-index seen (SQLite calls xShmBarrier when it
     * publishes a commit, and more often), and whether the wal-index is in shared memory at
     * all (xShmMap; not in heap-memory WAL mode, which has no barriers).
     * WAL files: their database's name pointer (sqlite3_filename_database), and the
     * database's publication count when the oldest bytes of the cached tail were written
     * (0: unknown). While no publication happened since, those bytes belong to the
     * transaction being written, which no one has seen committed: a torn rewrite of them
     * loses nothing committed, so no -cdtail copy is needed (cd_write_range). */
    unsigned long barriers;
    int shm_used;
    struct cdShm *shm; /* the wal-index off the disk (shm.c), once mapped */
    int shm_own;       /* 1: p->shm; -1: the default VFS's wal-index; 0: not decided yet */
    const char *wal_db_name;
    unsigned long tc_oldest;
    /* gathered journal / WAL bytes */
    unsigned char *pend;
    sqlite3_int64 pend_len;
    sqlite3_int64 pend_cap;
    sqlite3_int64 pend_high; /* the most bytes pend ever held (what x_close wipes) */
    sqlite3_int64 pend_start;
    int write_through;
    /* a rollback journal: the name pointer SQLite gave its database file when it opened it
     * (sqlite3_filename_database), so the journal of this very connection is found, not
     * another connection's journal of the same file */
    const char *journal_of;
    char *journal_of_copy; /* the database's path, for names a VFS shim above copied */
    /* the VFS's list this file is on (its journals or its database files), and the link */
    struct cdFile **listed_in;
    struct cdFile *next;
} cdFile;

/* Segment geometry: which segment holds a plaintext offset, where a segment starts, how
 * many bytes it holds when full, and where its record is. */
static inline sqlite3_int64 seg_index(const cdFile *p, sqlite3_int64 offset) {
    return offset < p->lead ? 0 : 1 + (offset - p->lead) / p->seg;
}
static inline sqlite3_int64 seg_start(const cdFile *p, sqlite3_int64 index) {
    return index == 0 ? 0 : p->lead + (index - 1) * p->seg;
}
static inline sqlite3_int64 seg_cap(const cdFile *p, sqlite3_int64 index) {
    return index == 0 ? p->lead : p->seg;
}
static inline sqlite3_int64 rec_at(const cdFile *p, sqlite3_int64 index) {
    return index == 0 ? HEADER_SIZE : HEADER_SIZE + p->lead + OVERHEAD + (index - 1) * p->rec;
}

/* cipher.c: the AEAD (libgcrypt or OpenSSL, chosen by the build), one record sealed or
 * opened, and process-wide counts (for tests and tuning);
 * cd_wipe clears plaintext buffers (explicit_bzero: a vectorised memset the compiler keeps,
 * where OPENSSL_cleanse's assembly clears 64 KiB in ~40k instructions) */
void cd_wipe(void *buf, size_t n);
extern unsigned long long n_seal, n_seal_bytes, n_unseal, n_unseal_bytes, n_tail_saves, n_tail_syncs;
extern unsigned long long n_reused; /* reads served from a kept plaintext (store.c) */
int cd_cipher_init(void);
const char *cd_cipher_library(void);
int cd_aead_open(cdFile *p, const unsigned char *dek, int len); /* p->enc, p->dec */
void cd_aead_close(cdFile *p);
unsigned long cd_generation(void); /* changes in a forked child */
int cd_seal(cdFile *p, sqlite3_int64 index, const unsigned char *plain, int n, unsigned char *dst);
int cd_unseal(cdFile *p, sqlite3_int64 index, unsigned char *record, sqlite3_int64 got, unsigned char *out);

/* rawio.c: raw bytes through the default VFS's file, and the -cdtail side file */
int raw_size(cdFile *p, sqlite3_int64 *out);
extern unsigned long long n_size_queries, n_size_fstats; /* raw_size calls; of them by xFileSize (fstat) */
int raw_read(cdFile *p, unsigned char *buf, sqlite3_int64 n, sqlite3_int64 where, sqlite3_int64 *got);
int raw_write(cdFile *p, const unsigned char *buf, sqlite3_int64 n, sqlite3_int64 where);
void pause_us(int us);
int tail_save(cdFile *p, sqlite3_int64 index, const unsigned char *record, sqlite3_int64 len);
sqlite3_int64 tail_load(cdFile *p, sqlite3_int64 index, unsigned char *into);

/* store.c: plaintext over records (CD_AUTH for a segment that does not authenticate) */
int cd_size(cdFile *p, sqlite3_int64 *out);
int cd_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset, sqlite3_int64 *got);
int cd_write(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset);
int cd_truncate_store(cdFile *p, sqlite3_int64 size);
void cd_forget_opened(cdFile *p); /* wipe and free the kept plaintexts */

/* headers.c: a file's header and data key through header_for (SQLITE_CANTOPEN with the
 * Python exception pending if it raised; CD_REREAD for an existing header that header_for
 * wants read again, its attempt-th read having failed as a torn one does), and a new
 * journal's from the VFS's pool */
int cd_ask_header(cdFile *p, const unsigned char *header, sqlite3_int64 hlen, int attempt, sqlite3_int64 seg,
                  int lead, int extra, unsigned char *out, unsigned char *dek, int *dek_len);
extern unsigned long long n_header_batches; /* calls into Python that filled a pool */
int cd_pooled_header(cdFile *p, sqlite3_int64 seg, int lead, int extra, unsigned char *header, unsigned char *dek,
                     int *dek_len);

/* file.c: one open file (header, gathering, the io methods; cd_plain_io: no encryption) */
extern const sqlite3_io_methods cd_io;
extern const sqlite3_io_methods cd_plain_io;
int cd_load(cdFile *p);
int x_close(sqlite3_file *f);
void cd_list_add(cdFile **head, cdFile *p);
unsigned long cd_publications(cdFile *p);

/* shm.c: the wal-index, in a memory file system instead of beside the database */
int cd_shm_map(cdFile *p, int region, int size, int extend, void volatile **out);
int cd_shm_lock(cdFile *p, int offset, int n, int flags);
void cd_shm_barrier(cdFile *p);
int cd_shm_unmap(cdFile *p, int delete_flag);

/* vfs.c: the Python callbacks (they take the GIL) */
void cd_keep_earlier(PyObject *et, PyObject *ev, PyObject *tb);
void cd_warn(cdFile *p, const char *fmt, ...);
int cd_raise(cdFile *p, int code, sqlite3_int64 offset, const char *fmt, ...);
int cd_os_error(int rc, int err, const char *path); /* an OSError pending; returns rc */
int cd_auth_error(cdFile *p);

#endif
