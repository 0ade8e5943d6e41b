/* One open file: its header (through Python), gathered journal/WAL writes, the io methods. */
#include "cvfs.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* -- headers (through Python, which holds the keys) ------------------------ */

static void cd_free_store(cdFile *p) {
    cd_aead_close(p);
    cd_forget_opened(p);
    if (p->plain)
        cd_wipe(p->plain, (size_t)p->seg);
    if (p->plain2)
        cd_wipe(p->plain2, (size_t)p->seg);
    if (p->tc_plain)
        cd_wipe(p->tc_plain, (size_t)p->seg);
    sqlite3_free(p->tc_plain);
    sqlite3_free(p->tc_rec);
    p->tc_plain = p->tc_rec = NULL;
    p->tc_valid = 0;
    sqlite3_free(p->rbuf);
    sqlite3_free(p->plain);
    sqlite3_free(p->plain2);
    sqlite3_free(p->batch);
    p->rbuf = p->plain = p->plain2 = p->batch = NULL;
    p->batch_cap = 0;
    p->loaded = 0;
}

static int cd_setup(cdFile *p, const unsigned char *header, const unsigned char *dek, Py_ssize_t deklen) {
    int log2 = header[11], kind = header[9];
    sqlite3_int64 lead = header[12] | (header[13] << 8), extra = header[14] | (header[15] << 8);
    if ((deklen != 32 && deklen != 16) || log2 < 9 || log2 > 24)
        return SQLITE_CORRUPT;
    p->sector = (sqlite3_int64)1 << log2;
    p->seg = kind == 3 ? p->sector + extra : p->sector;
    p->lead = kind == 3 ? lead : p->seg;
    if (p->lead < 1 || p->lead > p->seg)
        return SQLITE_CORRUPT; /* Python parsed and checked the header: cannot happen */
    p->rec = p->seg + OVERHEAD;
    memcpy(p->ad, header + 16, 16);
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
    if (!p->rbuf || !p->plain || !p->plain2 || cd_aead_open(p, dek, (int)deklen) != SQLITE_OK) {
        cd_free_store(p);
        return SQLITE_NOMEM;
    }
    p->loaded = 1;
    return SQLITE_OK;
}

/* The header and data key for this file (an existing header authenticated, or a new
 * file's), through header_for; set up the store, writing a new header first if asked.
 * CD_REREAD: read the existing header again and call again with attempt + 1. */
static int cd_call_header(cdFile *p, const unsigned char *header, sqlite3_int64 hlen, int attempt,
                          sqlite3_int64 seg, int lead, int extra, int write_it) {
    unsigned char h[HEADER_SIZE], dek[MAX_DEK];
    int dl = 0, rc;
    if (header == NULL && p->kind == KIND_JOURNAL) /* one per transaction in DELETE mode */
        rc = cd_pooled_header(p, seg, lead, extra, h, dek, &dl);
    else
        rc = cd_ask_header(p, header, hlen, attempt, seg, lead, extra, h, dek, &dl);
    if (rc == SQLITE_OK && write_it)
        rc = raw_write(p, h, HEADER_SIZE, 0);
    if (rc == SQLITE_OK)
        rc = cd_setup(p, h, dek, dl);
    cd_wipe(dek, sizeof dek);
    return rc; /* after a failed header_for its exception stays pending: apsw raises it */
}

/* Open the store if the file has a header (another process may have written it). A
 * header that header_for wants read again (one a rewrap, `cryptdisk sqlite rotate`, may
 * have been writing: bytes of the old and the new header) is read again here, after
 * header_for's pause, until it opens or header_for raises (as read_open_header in
 * format/_reread.py, with the reads through the default VFS's file). */
int cd_load(cdFile *p) {
    sqlite3_int64 size, got;
    unsigned char header[HEADER_SIZE];
    int rc, attempt = 0;
    if (p->loaded)
        return SQLITE_OK;
    if ((rc = raw_size(p, &size)) != SQLITE_OK)
        return rc;
    if (size == 0)
        return SQLITE_OK;
    do {
        if ((rc = raw_read(p, header, HEADER_SIZE, 0, &got)) != SQLITE_OK)
            return rc;
        rc = cd_call_header(p, header, got, attempt++, 0, 0, 0, 0);
    } while (rc == CD_REREAD);
    return rc;
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

static const unsigned char journal_magic[8] = {0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7};

static int is_wal_header(int kind, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset) {
    return kind == KIND_WAL && offset == 0 && n >= 12 && first[0] == 0x37 && first[1] == 0x7f && first[2] == 0x06;
}

static int is_journal_header(int kind, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset) {
    static const unsigned char zeros[8] = {0};
    /* SQLite writes the magic as zeros first unless synchronous=OFF, then the real magic
     * once the records are synced */
    return kind == KIND_JOURNAL && offset == 0 && n >= 28 &&
           (memcmp(first, journal_magic, 8) == 0 || memcmp(first, zeros, 8) == 0);
}

static int pow2_in_range(unsigned v) {
    return v >= 512 && v <= 65536 && (v & (v - 1)) == 0;
}

/* A new WAL or rollback journal is a framed file (as framing in _vfs.py): a record per WAL
 * frame or journal record, after the WAL header or the journal header (its sector size). */
static void framing(int kind, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset, int *lead,
                    int *extra) {
    *lead = *extra = 0;
    if (is_wal_header(kind, first, n, offset)) {
        *lead = WAL_HEADER;
        *extra = WAL_FRAME_HEADER;
    } else if (is_journal_header(kind, first, n, offset)) {
        unsigned sector = be(first + 20, 4), page = be(first + 24, 4);
        if (pow2_in_range(sector) && pow2_in_range(page) && sector <= page + JOURNAL_RECORD_EXTRA && sector <= 0xFFFF) {
            *lead = (int)sector;
            *extra = JOURNAL_RECORD_EXTRA;
        }
    }
}

/* The segment size for a new file, from the first bytes SQLite writes (as segment_size_for). */
static sqlite3_int64 segment_size_for(int kind, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset) {
    sqlite3_int64 page = 0;
    if (kind == KIND_MAIN && offset == 0 && n >= 18 && memcmp(first, "SQLite format 3", 16) == 0) {
        unsigned raw = be(first + 16, 2);
        page = raw == 1 ? 65536 : raw;
    } else if (kind == KIND_MAIN && offset == 0) {
        page = n;
    } else if (is_wal_header(kind, first, n, offset)) {
        page = be(first + 8, 4);
    } else if (is_journal_header(kind, first, n, offset)) {
        page = be(first + 24, 4);
    }
    if (page && (page & (page - 1)) == 0 && page >= 512 && page <= 65536)
        return page;
    return page == 0 ? 4096 : pow2_segment(page);
}

/* The header of a file written for the first time (a write, or gathered bytes written
 * before a read, a size query or a sync). A header_for that failed (its exception pending)
 * is an I/O error here, not SQLITE_CANTOPEN: only SQLITE_IOERR and SQLITE_FULL put SQLite's
 * pager in its error state, so that a rollback whose journal cannot be written or read
 * leaves no changed page in the connection's cache (with SQLITE_CANTOPEN it kept them, and
 * the connection saw a statement's partial update that was never committed). */
static int cd_create(cdFile *p, const unsigned char *first, sqlite3_int64 n, sqlite3_int64 offset) {
    int rc = cd_load(p), lead, extra;
    if (rc == SQLITE_OK && !p->loaded) {
        framing(p->kind, first, n, offset, &lead, &extra);
        rc = cd_call_header(p, NULL, 0, 0, segment_size_for(p->kind, first, n, offset), lead, extra, 1);
    }
    return rc == SQLITE_CANTOPEN ? SQLITE_IOERR_WRITE : rc;
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
        /* not realloc: the old buffer holds plaintext, which is wiped before it is freed */
        unsigned char *b = sqlite3_malloc64((sqlite3_uint64)cap);
        if (b == NULL)
            return SQLITE_NOMEM;
        if (p->pend != NULL) {
            memcpy(b, p->pend, (size_t)p->pend_len);
            cd_wipe(p->pend, (size_t)p->pend_high);
            sqlite3_free(p->pend);
        }
        p->pend = b;
        p->pend_cap = cap;
    }
    memcpy(p->pend + p->pend_len, data, (size_t)n);
    p->pend_len += n;
    if (p->pend_len > p->pend_high)
        p->pend_high = p->pend_len;
    return SQLITE_OK;
}

/* The open rollback journal of database file p (same connection), or NULL; call with the
 * VFS's lock held. */
static cdFile *cd_journal_of(cdFile *p) {
    cdFile *j;
    for (j = p->vfs->journals; j != NULL; j = j->next)
        if (j->journal_of == p->path) /* this connection's journal */
            return j;
    /* names copied by a VFS shim above this one: match by path */
    for (j = p->vfs->journals; j != NULL; j = j->next)
        if (strcmp(j->journal_of_copy, p->path) == 0)
            return j;
    return NULL;
}

static int cd_flush_journal(cdFile *p) {
    cdFile *j;
    if (p->vfs->journals == NULL)
        return SQLITE_OK;
    pthread_mutex_lock(&p->vfs->lock);
    j = cd_journal_of(p);
    pthread_mutex_unlock(&p->vfs->lock);
    return j != NULL && j->pend_len ? cd_flush(j) : SQLITE_OK;
}

/* Whether database file p's open journal already had a header when it was opened. */
static int cd_reused_journal(cdFile *p) {
    cdFile *j;
    int reused;
    if (p->vfs->journals == NULL)
        return 0;
    pthread_mutex_lock(&p->vfs->lock);
    j = cd_journal_of(p);
    reused = j != NULL && j->reused;
    pthread_mutex_unlock(&p->vfs->lock);
    return reused;
}

/* Internal result to SQLite's: CD_AUTH becomes PageAuthenticationError. */
static int cd_result(cdFile *p, int rc) {
    return rc == CD_AUTH ? cd_auth_error(p) : rc;
}

/* -- io methods -------------------------------------------------------------- */

/* The publication count of a WAL file's database (same connection), or 0 when unknown. */
unsigned long cd_publications(cdFile *p) {
    unsigned long n = 0;
    if (p->wal_db_name == NULL)
        return 0;
    pthread_mutex_lock(&p->vfs->lock);
    for (cdFile *m = p->vfs->mains; m != NULL; m = m->next)
        if (m->path == p->wal_db_name) {
            n = m->shm_used ? m->barriers : 0;
            break;
        }
    pthread_mutex_unlock(&p->vfs->lock);
    return n;
}

/* Put p on one of its VFS's lists (journals or database files), under the VFS's lock. */
void cd_list_add(cdFile **head, cdFile *p) {
    pthread_mutex_lock(&p->vfs->lock);
    p->next = *head;
    *head = p;
    p->listed_in = head;
    pthread_mutex_unlock(&p->vfs->lock);
}

static void cd_list_remove(cdFile *p) {
    pthread_mutex_lock(&p->vfs->lock);
    for (cdFile **link = p->listed_in; *link != NULL; link = &(*link)->next)
        if (*link == p) {
            *link = p->next;
            break;
        }
    pthread_mutex_unlock(&p->vfs->lock);
    p->listed_in = NULL;
}

int x_close(sqlite3_file *f) {
    cdFile *p = (cdFile *)f;
    int rc = cd_result(p, cd_flush(p));
    if (p->listed_in != NULL)
        cd_list_remove(p);
    sqlite3_free(p->journal_of_copy);
    p->journal_of_copy = NULL;
    p->journal_of = NULL;
    if (p->tail_fd >= 0)
        close(p->tail_fd);
    p->tail_fd = -1;
    sqlite3_free(p->tail_path);
    p->tail_path = NULL;
    cd_free_store(p);
    if (p->pend) {
        cd_wipe(p->pend, (size_t)p->pend_high);
        sqlite3_free(p->pend);
        p->pend = NULL;
    }
    if (p->shm != NULL)
        cd_shm_unmap(p, 0);
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
        sqlite3_int64 where = rec_at(p, seg_index(p, size));
        return cd_raise(p, ERR_TRUNCATED, where,
                        "%s: file is truncated: its header says %lld pages of %lld bytes but the file holds %lld",
                        p->path, (long long)pages, (long long)page, (long long)(size / page));
    }
    return SQLITE_OK;
}

/* Before a read or a size query: write gathered bytes, and open the store if the file has
 * a header by now (cantopen: what to answer when the header could not be read). */
static int cd_ready(cdFile *p, int cantopen) {
    int rc;
    if (p->pend_len && (rc = cd_result(p, cd_flush(p))) != SQLITE_OK)
        return rc;
    if (!p->loaded && (rc = cd_load(p)) != SQLITE_OK)
        return rc == SQLITE_CANTOPEN ? cantopen : rc;
    return SQLITE_OK;
}

static int x_read(sqlite3_file *f, void *buf, int amount, sqlite3_int64 offset) {
    cdFile *p = (cdFile *)f;
    sqlite3_int64 got = 0;
    int rc;
    if ((rc = cd_ready(p, SQLITE_IOERR_READ)) != SQLITE_OK)
        return rc;
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

/* The page size in the header of a database's page 1, or 0 when it is not one. */
static sqlite3_int64 page_size_of(const unsigned char *page1, sqlite3_int64 n) {
    unsigned raw;
    if (n < 18 || memcmp(page1, "SQLite format 3", 16) != 0)
        return 0;
    raw = be(page1 + 16, 2);
    return raw == 1 ? 65536 : raw;
}

/* Refuse a page 1 whose page size is smaller than the file's records (a VACUUM or a
 * backup to a smaller page size): such a page would share a record with others, and a
 * write of it cut by a crash would lose pages the journal does not hold. A database whose
 * pages are that small already (an older cryptdisk's VACUUM) goes on as before. As
 * _check_page_size in _vfs.py. */
static int check_page_size(cdFile *p, const unsigned char *page1, sqlite3_int64 n) {
    unsigned char stored[18];
    sqlite3_int64 page = page_size_of(page1, n), got = 0, was;
    if (page == 0 || page >= p->sector)
        return SQLITE_OK;
    if (cd_read(p, stored, sizeof stored, 0, &got) != SQLITE_OK)
        return SQLITE_OK; /* the write fails on the same record, as it did before */
    was = page_size_of(stored, got);
    if (was && was < p->sector)
        return SQLITE_OK;
    cd_raise(p, ERR_PAGESIZE, 0,
             "%s: the page size cannot shrink to %lld bytes: this file's encrypted records hold "
             "%lld-byte pages, and a smaller page would share a record with others, which a crash "
             "while writing it could lose; use PRAGMA page_size=%lld and VACUUM INTO a new file instead",
             p->path, (long long)page, (long long)p->sector, (long long)page);
    return SQLITE_IOERR_WRITE;
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
        if (offset == 0 && p->kind == KIND_MAIN && !p->anonymous && (rc = check_page_size(p, data, n)) != SQLITE_OK)
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
    if (size == 0 && p->kind == KIND_JOURNAL) {
        /* An emptied rollback journal (TRUNCATE mode ends every transaction so, a journal
         * size limit of 0 too) loses its header as well: SQLite's next transaction opens
         * an empty file and lays a new journal out for itself, which may claim safe
         * append (see x_device_characteristics), as in DELETE mode. An empty journal is
         * no journal to SQLite, with or without a header. */
        if ((rc = p->real->pMethods->xTruncate(p->real, 0)) != SQLITE_OK)
            return rc;
        cd_free_store(p); /* a new data key and file id at the next write */
        p->pend_start = 0;
        p->tail_pending = 0;
        return SQLITE_OK;
    }
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
    if ((rc = p->real->pMethods->xSync(p->real, flags)) != SQLITE_OK)
        return rc;
    p->tail_pending = 0; /* the rewrite of the record saved last is durable now */
    return SQLITE_OK;
}

static int x_file_size(sqlite3_file *f, sqlite3_int64 *size) {
    cdFile *p = (cdFile *)f;
    int rc;
    if ((rc = cd_ready(p, SQLITE_IOERR_FSTAT)) != SQLITE_OK)
        return rc;
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
    return p->loaded ? (int)p->sector : 512;
}

static int x_device_characteristics(sqlite3_file *f) {
    /* Power-safe overwrite: a database page is one record, rewritten whole, and a framed
     * WAL has a record per frame: no commit shares a record with the one before it, so
     * SQLite need not pad commits to a sector boundary. Safe append: a framed journal's
     * record reads back as what was written there or, not authentic, as zeros (page number
     * 0 ends SQLite's playback), so SQLite may take the record count from the size and sync
     * once per commit. Not while the journal is one that had a header when it was opened
     * (PERSIST reusing it, a hot journal; TRUNCATE empties it whole, see x_truncate): its
     * segments were laid out at its creation (mutable by an older cryptdisk, or for a page
     * size VACUUM has changed since), so a torn one could zero part of a record. As
     * xDeviceCharacteristics in _vfs.py. */
    cdFile *p = (cdFile *)f;
    if (p->kind != KIND_MAIN)
        return 0;
    if (cd_reused_journal(p)) /* decided at the journal's open: never changes mid-transaction */
        return SQLITE_IOCAP_POWERSAFE_OVERWRITE;
    return SQLITE_IOCAP_POWERSAFE_OVERWRITE | SQLITE_IOCAP_SAFE_APPEND;
}

static int x_shm_map(sqlite3_file *f, int region, int size, int extend, void volatile **out) {
    cdFile *p = (cdFile *)f;
    p->shm_used = 1;
    return cd_shm_map(p, region, size, extend, out);
}

static int x_shm_lock(sqlite3_file *f, int offset, int n, int flags) {
    return cd_shm_lock((cdFile *)f, offset, n, flags);
}

static void x_shm_barrier(sqlite3_file *f) {
    cdFile *p = (cdFile *)f;
    p->barriers++;
    cd_shm_barrier(p);
}

static int x_shm_unmap(sqlite3_file *f, int delete_flag) {
    return cd_shm_unmap((cdFile *)f, delete_flag);
}

const sqlite3_io_methods cd_io = {
    2, /* shared memory, no xFetch: SQLite never maps ciphertext */
    x_close, x_read, x_write, x_truncate, x_sync, x_file_size, x_lock, x_unlock,
    x_check_reserved_lock, x_file_control, x_sector_size, x_device_characteristics,
    x_shm_map, x_shm_lock, x_shm_barrier, x_shm_unmap, NULL, NULL,
};

/* -- the plain VFS: the default VFS's files, with the wal-index of shm.c ------------- */
/* (the base of the Python VFS, which apsw lets override every method but the shm ones) */

#define REAL(f) (((cdFile *)(f))->real)
static int y_close(sqlite3_file *f) {
    cdFile *p = (cdFile *)f;
    if (p->shm != NULL)
        cd_shm_unmap(p, 0);
    return p->real->pMethods ? p->real->pMethods->xClose(p->real) : SQLITE_OK;
}
static int y_read(sqlite3_file *f, void *buf, int n, sqlite3_int64 at) { return REAL(f)->pMethods->xRead(REAL(f), buf, n, at); }
static int y_write(sqlite3_file *f, const void *buf, int n, sqlite3_int64 at) {
    return REAL(f)->pMethods->xWrite(REAL(f), buf, n, at);
}
static int y_truncate(sqlite3_file *f, sqlite3_int64 size) { return REAL(f)->pMethods->xTruncate(REAL(f), size); }
static int y_sync(sqlite3_file *f, int flags) { return REAL(f)->pMethods->xSync(REAL(f), flags); }
static int y_file_size(sqlite3_file *f, sqlite3_int64 *out) { return REAL(f)->pMethods->xFileSize(REAL(f), out); }
static int y_file_control(sqlite3_file *f, int op, void *arg) { return REAL(f)->pMethods->xFileControl(REAL(f), op, arg); }
static int y_sector_size(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int y_device_characteristics(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static void y_shm_barrier(sqlite3_file *f) { cd_shm_barrier((cdFile *)f); }

const sqlite3_io_methods cd_plain_io = {
    2, y_close, y_read, y_write, y_truncate, y_sync, y_file_size, x_lock, x_unlock,
    x_check_reserved_lock, y_file_control, y_sector_size, y_device_characteristics,
    x_shm_map, x_shm_lock, y_shm_barrier, x_shm_unmap, NULL, NULL,
};
