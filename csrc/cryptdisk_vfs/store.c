/* The store: plaintext reads, writes and truncation over records (as format/_mutable.py's
 * MutableStore), with the cached tail segment. */
#include "cvfs.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static const int RETRY_US[] = {0, 1000, 5000, 20000};
#define RETRIES 4

/* -- the store ------------------------------------------------------------- */

/* The plaintext size of a raw file size (as SegmentLayout.measure); *cut is the length of a
 * last record too short to hold any plaintext (0 if none), which the size leaves out. */
static sqlite3_int64 cd_measure(cdFile *p, sqlite3_int64 raw, sqlite3_int64 *cut) {
    sqlite3_int64 body = raw - HEADER_SIZE, first = p->lead + OVERHEAD, full, rest;
    *cut = 0;
    if (body <= 0)
        return 0;
    if (body <= first) {
        if (body <= OVERHEAD) {
            *cut = body;
            return 0;
        }
        return body - OVERHEAD;
    }
    full = (body - first) / p->rec;
    rest = (body - first) % p->rec;
    if (rest > 0 && rest <= OVERHEAD) {
        *cut = rest;
        rest = 0;
    }
    return p->lead + full * p->seg + (rest ? rest - OVERHEAD : 0);
}

/* Plaintext size now (another process may have written). */
int cd_size(cdFile *p, sqlite3_int64 *out) {
    sqlite3_int64 raw, cut;
    int rc = raw_size(p, &raw);
    if (rc != SQLITE_OK)
        return rc;
    *out = cd_measure(p, raw, &cut);
    for (int i = 0; cut && i < RETRIES; i++) {
        pause_us(RETRY_US[i]); /* maybe another process is appending a record right now */
        if ((rc = raw_size(p, &raw)) != SQLITE_OK)
            return rc;
        *out = cd_measure(p, raw, &cut);
    }
    /* At most OVERHEAD bytes of a record: an append cut by a crash (see _store.py). */
    if (cut)
        cd_warn(p, "%s: ignoring a cut record of %lld bytes at the end (a write cut by a crash?)",
                p->path, (long long)cut);
    return SQLITE_OK;
}

/* -- records opened lately (cdOpened in cvfs.h) ------------------------------ */

unsigned long long n_reused;

static void opened_drop(cdOpened *o, sqlite3_int64 len) {
    if (o->data != NULL) {
        cd_wipe(o->data, (size_t)(2 * len));
        sqlite3_free(o->data);
        o->data = NULL;
    }
}

void cd_forget_opened(cdFile *p) {
    if (p->opened == NULL)
        return;
    for (int i = 0; i < OPENED; i++)
        opened_drop(&p->opened[i], p->opened[i].len);
    sqlite3_free(p->opened);
    p->opened = NULL;
}

static cdOpened *opened_find(cdFile *p, sqlite3_int64 index) {
    if (p->opened != NULL)
        for (int i = 0; i < OPENED; i++)
            if (p->opened[i].len && p->opened[i].index == index)
                return &p->opened[i];
    return NULL;
}

/* The record of got bytes in p->rbuf is o's kept one, byte for byte: its plaintext into out. */
static int opened_reuse(cdFile *p, cdOpened *o, sqlite3_int64 got, unsigned char *out) {
    if (o == NULL || o->data == NULL || o->len != got || memcmp(o->data, p->rbuf, (size_t)got) != 0)
        return 0;
    memcpy(out, o->data + got, (size_t)(got - OVERHEAD));
    o->used = ++p->opened_clock;
    n_reused++;
    return 1;
}

/* The record of got bytes in p->rbuf (segment index) authenticated, its plaintext in plain:
 * remember it; keep its bytes and plaintext if it was opened before, unchanged. */
static void opened_note(cdFile *p, cdOpened *o, sqlite3_int64 index, sqlite3_int64 got,
                        const unsigned char *plain) {
    if (p->kind != KIND_MAIN && p->kind != KIND_WAL)
        return;
    if (o == NULL) {
        if (p->opened == NULL && (p->opened = sqlite3_malloc64(OPENED * sizeof *p->opened)) != NULL)
            memset(p->opened, 0, OPENED * sizeof *p->opened);
        if (p->opened == NULL)
            return;
        o = &p->opened[0];
        for (int i = 1; i < OPENED && o->len; i++)
            if (!p->opened[i].len || p->opened[i].used < o->used)
                o = &p->opened[i];
        opened_drop(o, o->len);
        o->index = index;
    } else if (o->len == got && memcmp(o->nonce, p->rbuf, NONCE) == 0) {
        if (o->data == NULL)
            o->data = sqlite3_malloc64((sqlite3_uint64)(2 * got));
        if (o->data != NULL) {
            memcpy(o->data, p->rbuf, (size_t)got);
            memcpy(o->data + got, plain, (size_t)(got - OVERHEAD));
        }
    } else {
        opened_drop(o, o->len); /* another record now: remember it, keep nothing yet */
    }
    o->len = got;
    memcpy(o->nonce, p->rbuf, NONCE);
    o->used = ++p->opened_clock;
}

/* Decrypt segment index into out; *n is its plaintext length (0 past the end).
 * Returns CD_AUTH when it does not authenticate (and is not a torn journal/WAL segment). */
static int cd_decrypt(cdFile *p, sqlite3_int64 index, unsigned char *out, sqlite3_int64 *n) {
    sqlite3_int64 where = rec_at(p, index), len = seg_cap(p, index) + OVERHEAD, got;
    int rc = raw_read(p, p->rbuf, len, where, &got);
    if (rc != SQLITE_OK)
        return rc;
    if (got == 0) {
        *n = 0;
        return SQLITE_OK;
    }
    cdOpened *o = opened_find(p, index);
    if (opened_reuse(p, o, got, out)) {
        p->rec_len = got;
        *n = got - OVERHEAD;
        return SQLITE_OK;
    }
    if (cd_unseal(p, index, p->rbuf, got, out)) {
        opened_note(p, o, index, got, out);
        p->rec_len = got;
        *n = got - OVERHEAD;
        return SQLITE_OK;
    }
    for (int i = 0; i < RETRIES; i++) {
        /* another process may be rewriting this very segment: read again */
        pause_us(RETRY_US[i]);
        if ((rc = raw_read(p, p->rbuf, len, where, &got)) != SQLITE_OK)
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
    sqlite3_int64 r0 = seg_cap(p, index) + OVERHEAD, head = seg_cap(p, index) - lo, got, n2;
    if (raw_read(p, p->rbuf, r0 + p->rec, rec_at(p, index), &got) != SQLITE_OK)
        return 0;
    n2 = got - r0 - OVERHEAD;
    if (n2 < amount - head)
        return 0;
    if (!cd_unseal(p, index, p->rbuf, r0, p->plain))
        return 0;
    if (!cd_unseal(p, index + 1, p->rbuf + r0, got - r0, p->plain2)) {
        cd_wipe(p->plain, (size_t)p->seg);
        return 0;
    }
    memcpy(buf, p->plain + lo, (size_t)head);
    memcpy(buf + head, p->plain2, (size_t)(amount - head));
    return 1;
}

/* Up to amount plaintext bytes at offset into buf; *got is how many (fewer only at the end). */
int cd_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset, sqlite3_int64 *got) {
    sqlite3_int64 index = seg_index(p, offset), lo = offset - seg_start(p, index), seg = seg_cap(p, index);
    sqlite3_int64 pos = 0, n;
    int rc;
    if (lo == 0 && amount == seg) { /* the page fast path (a whole frame of a framed WAL) */
        rc = cd_decrypt(p, index, buf, &n);
        *got = n;
        return rc;
    }
    if (lo && lo + amount > seg && amount - (seg - lo) <= p->seg && cd_straddle(p, index, lo, amount, buf)) {
        *got = amount;
        return SQLITE_OK;
    }
    while (pos < amount) {
        index = seg_index(p, offset + pos);
        lo = offset + pos - seg_start(p, index);
        seg = seg_cap(p, index);
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

/* Is the cached last segment still the one on disk? One 16-byte read of its nonce (each
 * write draws a fresh random nonce, so another writer's record has another nonce). A
 * partial segment is the last of its file, and nobody can append past it without
 * rewriting it, so while it is intact the file's size is known too. */
static int cd_cached_tail(cdFile *p, sqlite3_int64 index) {
    unsigned char nonce[NONCE];
    sqlite3_int64 got;
    if (!p->tc_valid || index != p->tc_index)
        return 0;
    if (raw_read(p, nonce, NONCE, rec_at(p, index), &got) == SQLITE_OK && got == NONCE &&
        memcmp(nonce, p->tc_rec, NONCE) == 0)
        return 1;
    p->tc_valid = 0;
    return 0;
}

/* Seal the segments [offset, offset + n) touches and write them with one write.
 * cached: the first segment is the cached tail (cd_cached_tail said so). */
static int cd_write_range(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset,
                            sqlite3_int64 size, int cached) {
    sqlite3_int64 pos = 0, used = 0, first, last, base, span;
    sqlite3_int64 new_tail = -1; /* index of a partial last segment this write leaves */
    sqlite3_int64 last_lo = 0;  /* where this write starts in the segment it leaves cached */
    unsigned long pubs = p->kind == KIND_WAL ? cd_publications(p) : 0;
    int rc;
    if (n <= 0)
        return SQLITE_OK;
    first = seg_index(p, offset);
    last = seg_index(p, offset + n - 1);
    base = rec_at(p, first);
    span = rec_at(p, last) + seg_cap(p, last) + OVERHEAD - base;
    if (p->tc_plain != NULL && p->tc_index >= first && p->tc_index <= last)
        p->tc_valid = 0; /* rewritten below (or the write fails): no longer what is on disk */
    if (p->batch_cap < span) {
        unsigned char *b = sqlite3_realloc64(p->batch, (sqlite3_uint64)span);
        if (b == NULL)
            return SQLITE_NOMEM;
        p->batch = b;
        p->batch_cap = span;
    }
    while (pos < n) {
        sqlite3_int64 index = seg_index(p, offset + pos), lo = offset + pos - seg_start(p, index);
        sqlite3_int64 seg = seg_cap(p, index);
        sqlite3_int64 take = seg - lo < n - pos ? seg - lo : n - pos;
        sqlite3_int64 old_len = size - seg_start(p, index);
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
            /* bytes before lo may be committed: keep the old record until the new one is on
             * disk, unless nobody has seen them committed (see tc_oldest in cvfs.h) */
            int mine = cached && index == first && p->kind == KIND_WAL;
            int unpublished = mine && pubs != 0 && p->tc_oldest == pubs;
            if (lo && p->tail_path != NULL && !unpublished) {
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
        sqlite3_int64 slot = rec_at(p, index) - base;
        if ((rc = cd_seal(p, index, plain, (int)plen, p->batch + slot)) != SQLITE_OK)
            return rc;
        used = slot + plen + OVERHEAD;
        pos += take;
        if (pos >= n && (plen < seg || offset + n != seg_start(p, index) + seg) && p->tc_plain != NULL) {
            memcpy(p->tc_plain, plain, (size_t)plen);
            memcpy(p->tc_rec, p->batch + slot, (size_t)(plen + OVERHEAD));
            p->tc_len = plen;
            new_tail = index;
            last_lo = lo;
        }
    }
    if ((rc = raw_write(p, p->batch, used, base)) != SQLITE_OK)
        return rc;
    if (new_tail >= 0) {
        /* the oldest bytes of the new tail: this write's when it starts the segment, else
         * the ones kept from the cached tail before it (unknown if that was not cached) */
        p->tc_oldest = pubs == 0 ? 0 : last_lo == 0 ? pubs : (cached && new_tail == first) ? p->tc_oldest : 0;
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
    rc = cd_write_range(p, zeros, n, offset, size, 0);
    sqlite3_free(zeros);
    return rc;
}

static int cd_encrypt_write(cdFile *p, sqlite3_int64 index, const unsigned char *plain, sqlite3_int64 n) {
    int rc;
    if (index == p->tc_index)
        p->tc_valid = 0;
    rc = cd_seal(p, index, plain, (int)n, p->rbuf);
    if (rc != SQLITE_OK)
        return rc;
    return raw_write(p, p->rbuf, n + OVERHEAD, rec_at(p, index));
}

int cd_write(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset) {
    sqlite3_int64 index = seg_index(p, offset), lo = offset - seg_start(p, index), seg = seg_cap(p, index), size;
    int rc;
    if (lo == 0 && n == seg) { /* the page fast path: one whole segment */
        if (offset > 0) {
            sqlite3_int64 raw;
            if ((rc = raw_size(p, &raw)) != SQLITE_OK)
                return rc;
            if (raw < rec_at(p, index)) {
                if ((rc = cd_size(p, &size)) != SQLITE_OK)
                    return rc;
                if (offset > size && (rc = cd_write_zeros(p, offset - size, size, size)) != SQLITE_OK)
                    return rc;
            }
        }
        return cd_encrypt_write(p, index, data, n);
    }
    int cached = cd_cached_tail(p, index);
    if (cached && p->tc_len < seg && offset <= seg_start(p, index) + p->tc_len) {
        size = seg_start(p, index) + p->tc_len; /* a partial segment is the file's last */
    } else if ((rc = cd_size(p, &size)) != SQLITE_OK) {
        return rc;
    }
    if (offset > size) {
        if ((rc = cd_write_zeros(p, offset - size, size, size)) != SQLITE_OK)
            return rc;
        size = offset;
        cached = cd_cached_tail(p, index);
    }
    return cd_write_range(p, data, n, offset, size, cached);
}

int cd_truncate_store(cdFile *p, sqlite3_int64 size) {
    sqlite3_int64 current, count, rest, got;
    int rc;
    p->tc_valid = 0;
    if (size < p->wal_high)
        p->wal_high = size;
    if ((rc = cd_size(p, &current)) != SQLITE_OK)
        return rc;
    if (size >= current) {
        if (size > current)
            return cd_write_zeros(p, size - current, current, current);
        if (size == seg_start(p, seg_index(p, size))) {
            sqlite3_int64 raw, target = rec_at(p, seg_index(p, size));
            if ((rc = raw_size(p, &raw)) != SQLITE_OK)
                return rc;
            if (raw > target)
                return p->real->pMethods->xTruncate(p->real, target); /* drop a cut record */
        }
        return SQLITE_OK;
    }
    count = seg_index(p, size);
    rest = size - seg_start(p, count);
    if (rest) {
        if ((rc = cd_decrypt(p, count, p->plain, &got)) != SQLITE_OK)
            return rc;
        if (got < rest) {
            p->fail_index = count;
            return CD_AUTH;
        }
        if (p->tail_path != NULL && (rc = tail_save(p, count, p->rbuf, p->rec_len)) != SQLITE_OK)
            return rc;
        if ((rc = p->real->pMethods->xTruncate(p->real, rec_at(p, count))) != SQLITE_OK)
            return rc;
        return cd_encrypt_write(p, count, p->plain, rest);
    }
    return p->real->pMethods->xTruncate(p->real, rec_at(p, count));
}
