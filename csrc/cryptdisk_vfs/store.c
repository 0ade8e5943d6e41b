/* The store: plaintext reads, writes and truncation over records (as _store.py), with the
 * cached tail segment and the WAL mirror. */
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

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

static int cd_mirror_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset);

static const int RETRY_US[] = {0, 1000, 5000, 20000};
#define RETRIES 4

/* -- the store ------------------------------------------------------------- */

static int cd_split_size(cdFile *p, sqlite3_int64 raw, sqlite3_int64 *full, sqlite3_int64 *rest) {
    if (raw < HEADER_SIZE)
        return 0;
    *full = (raw - HEADER_SIZE) / p->rec;
    *rest = (raw - HEADER_SIZE) % p->rec;
    return 1;
}

/* Plaintext size now (another process may have written). */
int cd_size(cdFile *p, sqlite3_int64 *out) {
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

/* Up to amount plaintext bytes at offset into buf; *got is how many (fewer only at the end). */
int cd_read(cdFile *p, unsigned char *buf, sqlite3_int64 amount, sqlite3_int64 offset, sqlite3_int64 *got) {
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

void mirror_free(cdFile *p) {
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
static int cd_write_range(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset,
                            sqlite3_int64 size, int cached) {
    sqlite3_int64 seg = p->seg, rec = p->rec, pos = 0, used = 0;
    sqlite3_int64 first = offset / seg, count = (offset + n - 1) / seg - first + 1;
    sqlite3_int64 new_tail = -1; /* index of a partial last segment this write leaves */
    sqlite3_int64 last_lo = 0;  /* where this write starts in the segment it leaves cached */
    unsigned long pubs = p->kind == KIND_WAL ? cd_publications(p) : 0;
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
            /* bytes before lo may be committed: keep the old record until the new one is on
             * disk, unless they are a synced commit's padding (see synced_upto in cvfs.h) */
            int mine = cached && index == first && p->kind == KIND_WAL;
            int padding_only = mine && p->tc_after_sync && index * seg >= p->synced_upto;
            int unpublished = mine && pubs != 0 && p->tc_oldest == pubs;
            if (lo && p->tail_path != NULL && !padding_only && !unpublished) {
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
            last_lo = lo;
        }
    }
    if ((rc = raw_write(p, p->batch, used, HEADER_SIZE + first * rec)) != SQLITE_OK)
        return rc;
    if (new_tail >= 0) {
        /* the oldest bytes of the new tail: this write's when it starts the segment, else
         * the ones kept from the cached tail before it (unknown if that was not cached) */
        p->tc_oldest = pubs == 0 ? 0 : last_lo == 0 ? pubs : (cached && new_tail == first) ? p->tc_oldest : 0;
        p->tc_index = new_tail;
        p->tc_valid = 1;
        p->tc_after_sync = p->synced_since_commit;
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
    mirror_drop(p, index);
    rc = cd_seal(p, index, plain, (int)n, p->rbuf);
    if (rc != SQLITE_OK)
        return rc;
    return raw_write(p, p->rbuf, n + OVERHEAD, HEADER_SIZE + index * p->rec);
}

int cd_write(cdFile *p, const unsigned char *data, sqlite3_int64 n, sqlite3_int64 offset) {
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
    return cd_write_range(p, data, n, offset, size, cached);
}

int cd_truncate_store(cdFile *p, sqlite3_int64 size) {
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
