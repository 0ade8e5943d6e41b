/*
 * The wal-index (SQLite's shared memory for WAL mode) kept off the disk.
 *
 * SQLite's unix VFS keeps the wal-index in "<db>-shm" beside the database: page numbers,
 * frame counts, salts and a running checksum over the WAL's plaintext, on disk for as long
 * as the database is open and after a crash. This VFS keeps it in a memory file system
 * instead (CRYPTDISK_SHM_DIR, default /dev/shm), and still lets every process that opens
 * the database share it:
 *
 * - "<db>-shm" stays, as a lock file that never holds the index: one line naming a random
 *   token, "cryptdisk wal-index <32 hex digits>\n". Every connection holds read locks on
 *   the bytes where SQLite's unix VFS takes its dead-man switch (128) and its WAL write
 *   lock (120), with open-file-description locks (F_OFD_SETLK: one per connection, and
 *   never dropped by another descriptor's close).
 * - The first connection anywhere (the one that gets a write lock on byte 128) picks the
 *   token, creates the empty anchor file "<dir>/cryptdisk-<token>" with the database's
 *   permissions, removes a stale anchor a crash left, and writes the line. The others read
 *   the line and open the anchor, which exists only in the memory file system the first
 *   connection used.
 * - The wal-index itself is the unix VFS's shared memory of the anchor (SQLite's own code,
 *   "<dir>/cryptdisk-<token>-shm", with its in-process sharing and locks); this file only
 *   decides where it lives.
 *
 * What this catches: a process that sees another memory file system (another container
 * or mount namespace sharing the database's directory) finds no anchor, and a process that
 * keeps the index beside the database (cryptdisk without this extension) leaves no token
 * and cannot take the WAL write lock; either way the connection gets an error instead of
 * two wal-indexes for one WAL. When the lock file cannot be written (a read-only
 * database), or the platform has no open-file-description locks, the wal-index stays with
 * the unix VFS, beside the database, as before.
 */
#include "cvfs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/rand.h>

#define SHM_WRITE_BYTE 120 /* SQLite's unix VFS: the WAL write lock in a -shm file */
#define SHM_DMS_BYTE 128   /* ... and its dead-man switch */
#define TOKEN_LINE "cryptdisk wal-index "
#define TOKEN_HEX 32
#define LINE_LEN (sizeof TOKEN_LINE - 1 + TOKEN_HEX + 1)

struct cdShm {
    int fd;                  /* "<db>-shm": the token and the locks */
    char *lock_path;
    char *anchor_path;       /* "<dir>/cryptdisk-<token>" */
    const char *anchor_name; /* the same, as an SQLite filename (sqlite3_create_filename) */
    sqlite3_file *anchor;    /* the unix VFS's file of the anchor, whose shared memory is ours */
};

#ifdef F_OFD_SETLK

static const char *shm_dir(void) {
    const char *d = getenv("CRYPTDISK_SHM_DIR");
    return d != NULL && *d ? d : "/dev/shm";
}

/* An open-file-description lock on one byte; 0 or -1 (errno). */
static int ofd_lock(int fd, short type, int offset, int wait) {
    struct flock l;
    int rc;
    memset(&l, 0, sizeof l);
    l.l_type = type;
    l.l_whence = SEEK_SET;
    l.l_start = offset;
    l.l_len = 1;
    do
        rc = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &l);
    while (rc < 0 && errno == EINTR);
    return rc;
}

/* The token in the lock file's line into token (TOKEN_HEX + 1 bytes), or 0 if none. */
static int read_token(int fd, char *token) {
    char line[LINE_LEN];
    ssize_t n = pread(fd, line, sizeof line, 0);
    if (n != (ssize_t)sizeof line || memcmp(line, TOKEN_LINE, sizeof TOKEN_LINE - 1) != 0 ||
        line[sizeof line - 1] != '\n')
        return 0;
    for (int i = 0; i < TOKEN_HEX; i++) {
        char c = line[sizeof TOKEN_LINE - 1 + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        token[i] = c;
    }
    token[TOKEN_HEX] = 0;
    return 1;
}

static void remove_anchor(const char *token) {
    char path[4096];
    snprintf(path, sizeof path, "%s/cryptdisk-%s-shm", shm_dir(), token);
    unlink(path);
    snprintf(path, sizeof path, "%s/cryptdisk-%s", shm_dir(), token);
    unlink(path);
}

/* First connection: a new token and anchor, the stale ones gone, then the line. */
static int start_index(cdFile *p, struct cdShm *s, mode_t mode, char *token) {
    unsigned char raw[TOKEN_HEX / 2];
    char line[LINE_LEN + 1];
    ssize_t n;
    int rc;
    if (read_token(s->fd, token))
        remove_anchor(token);
    if (RAND_bytes(raw, sizeof raw) != 1)
        return SQLITE_IOERR_SHMOPEN;
    for (int i = 0; i < TOKEN_HEX / 2; i++)
        sprintf(token + 2 * i, "%02x", raw[i]);
    char *anchor = sqlite3_mprintf("%s/cryptdisk-%s", shm_dir(), token);
    int afd = anchor ? open(anchor, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode) : -1;
    if (afd < 0) {
        int err = errno;
        sqlite3_free(anchor);
        return cd_raise(p, ERR_SHM, 0, "%s: cannot create the WAL index in %s (%s); set CRYPTDISK_SHM_DIR to a writable directory in memory (tmpfs)",
                        p->path, shm_dir(), strerror(err));
    }
    if (fchmod(afd, mode) != 0) { /* the database's permissions, whatever the umask */
        int err = errno;
        close(afd);
        unlink(anchor);
        rc = cd_os_error(SQLITE_IOERR_SHMOPEN, err, anchor);
        sqlite3_free(anchor);
        return rc;
    }
    close(afd);
    sqlite3_free(anchor);
    snprintf(line, sizeof line, "%s%s\n", TOKEN_LINE, token);
    int err = 0;
    if (ftruncate(s->fd, 0) != 0)
        err = errno;
    else if ((n = pwrite(s->fd, line, LINE_LEN, 0)) != (ssize_t)LINE_LEN)
        err = n < 0 ? errno : ENOSPC; /* (a short write: the device is full) */
    if (err != 0) {
        remove_anchor(token);
        return cd_os_error(SQLITE_IOERR_SHMOPEN, err, s->lock_path);
    }
    return SQLITE_OK;
}

/* Whether the lock file at its path is still the one s->fd has open: the last connection
 * to close removes it, and one that opened it just before must start again. */
static int still_linked(struct cdShm *s) {
    struct stat a, b;
    return fstat(s->fd, &a) == 0 && stat(s->lock_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

#define CD_AGAIN (-2) /* join_index: the lock file was removed meanwhile; open it again */

/* Take the lock file's locks and find (or, first, make) the anchor. */
static int join_index(cdFile *p, struct cdShm *s, mode_t mode) {
    char token[TOKEN_HEX + 1];
    int rc;
    if (ofd_lock(s->fd, F_WRLCK, SHM_DMS_BYTE, 0) == 0) {
        if (!still_linked(s))
            return CD_AGAIN;
        rc = start_index(p, s, mode, token);
        if (rc != SQLITE_OK)
            return rc;
        if (ofd_lock(s->fd, F_RDLCK, SHM_DMS_BYTE, 0) != 0)
            return SQLITE_IOERR_SHMOPEN;
    } else {
        if (ofd_lock(s->fd, F_RDLCK, SHM_DMS_BYTE, 1) != 0)
            return SQLITE_IOERR_SHMOPEN;
        if (!still_linked(s))
            return CD_AGAIN;
        if (!read_token(s->fd, token))
            return cd_raise(p, ERR_SHM, 0,
                            "%s: another process has this database open with its WAL index on disk beside it "
                            "(cryptdisk without its C extension, or with no usable CRYPTDISK_SHM_DIR); "
                            "close the database there, or open it here with the same cryptdisk",
                            p->path);
    }
    if (ofd_lock(s->fd, F_RDLCK, SHM_WRITE_BYTE, 0) != 0)
        return cd_raise(p, ERR_SHM, 0,
                        "%s: another process is writing this database with its WAL index on disk beside it; "
                        "close the database there first",
                        p->path);
    s->anchor_path = sqlite3_mprintf("%s/cryptdisk-%s", shm_dir(), token);
    s->anchor_name = s->anchor_path ? sqlite3_create_filename(s->anchor_path, "", "", 0, NULL) : NULL;
    s->anchor = sqlite3_malloc(p->vfs->root->szOsFile);
    if (s->anchor_name == NULL || s->anchor == NULL)
        return SQLITE_NOMEM;
    memset(s->anchor, 0, (size_t)p->vfs->root->szOsFile);
    rc = p->vfs->root->xOpen(p->vfs->root, s->anchor_name, s->anchor, SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_READWRITE, NULL);
    if (rc != SQLITE_OK) {
        s->anchor->pMethods = NULL;
        return cd_raise(p, ERR_SHM, 0,
                        "%s: the WAL index of this database is in a memory file system this process does not see "
                        "(%s does not exist here: the database is open in another container or mount namespace); "
                        "close it there, or give both processes the same memory file system (CRYPTDISK_SHM_DIR)",
                        p->path, s->anchor_path);
    }
    return SQLITE_OK;
}

static void shm_free(struct cdShm *s) {
    if (s->anchor != NULL && s->anchor->pMethods != NULL)
        s->anchor->pMethods->xClose(s->anchor);
    sqlite3_free(s->anchor);
    if (s->anchor_name != NULL)
        sqlite3_free_filename(s->anchor_name);
    sqlite3_free(s->anchor_path);
    sqlite3_free(s->lock_path);
    if (s->fd >= 0)
        close(s->fd); /* drops this connection's locks, and only them */
    sqlite3_free(s);
}

/* p->shm set up on first use: SQLITE_OK, or an error; NULL p->shm means the unix VFS's. */
static int shm_ready(cdFile *p) {
    struct stat st;
    struct cdShm *s;
    int rc;
    if (p->shm != NULL || p->shm_own < 0)
        return SQLITE_OK;
    p->shm_own = -1; /* until it works: the unix VFS's wal-index */
    if (p->anonymous || stat(shm_dir(), &st) != 0 || !S_ISDIR(st.st_mode) || stat(p->path, &st) != 0)
        return SQLITE_OK;
    if ((s = sqlite3_malloc(sizeof *s)) == NULL)
        return SQLITE_NOMEM;
    memset(s, 0, sizeof *s);
    s->fd = -1;
    if ((s->lock_path = sqlite3_mprintf("%s-shm", p->path)) == NULL) {
        shm_free(s);
        return SQLITE_NOMEM;
    }
    for (int tries = 0; tries < 1000; tries++) {
        s->fd = open(s->lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, st.st_mode & 0777);
        if (s->fd < 0) { /* a read-only database or directory */
            shm_free(s);
            return SQLITE_OK;
        }
        if ((rc = join_index(p, s, st.st_mode & 0777)) != CD_AGAIN)
            break;
        close(s->fd);
        s->fd = -1;
        rc = SQLITE_BUSY;
    }
    if (rc != SQLITE_OK) {
        shm_free(s);
        p->shm_own = 0; /* try again next time */
        return rc;
    }
    p->shm = s;
    p->shm_own = 1;
    return SQLITE_OK;
}

#else /* no open-file-description locks: the unix VFS's wal-index */

static int shm_ready(cdFile *p) {
    p->shm_own = -1;
    return SQLITE_OK;
}
static void shm_free(struct cdShm *s) { (void)s; }

#endif

static sqlite3_file *shm_file(cdFile *p) { return p->shm != NULL ? p->shm->anchor : p->real; }

int cd_shm_map(cdFile *p, int region, int size, int extend, void volatile **out) {
    int rc = shm_ready(p);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_file *f = shm_file(p);
    return f->pMethods->xShmMap(f, region, size, extend, out);
}

int cd_shm_lock(cdFile *p, int offset, int n, int flags) {
    int rc = shm_ready(p);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_file *f = shm_file(p);
    return f->pMethods->xShmLock(f, offset, n, flags);
}

void cd_shm_barrier(cdFile *p) {
    sqlite3_file *f = shm_file(p);
    f->pMethods->xShmBarrier(f);
}

/* The wal-index goes with its last connection anywhere: delete_flag says SQLite holds the
 * database's exclusive lock (no other connection) and deleted the WAL; otherwise a write
 * lock on the dead-man-switch byte says no other connection has the index (the next one
 * rebuilds it from the WAL, as SQLite does on every first open). */
int cd_shm_unmap(cdFile *p, int delete_flag) {
    struct cdShm *s = p->shm;
    sqlite3_file *f = shm_file(p);
    int rc = f->pMethods && f->pMethods->xShmUnmap ? f->pMethods->xShmUnmap(f, delete_flag) : SQLITE_OK;
    if (s != NULL) {
        s->anchor->pMethods->xClose(s->anchor); /* before it is removed (SQLite logs that) */
        s->anchor->pMethods = NULL;
#ifdef F_OFD_SETLK
        if (delete_flag || ofd_lock(s->fd, F_WRLCK, SHM_DMS_BYTE, 0) == 0) {
            char *index = sqlite3_mprintf("%s-shm", s->anchor_path);
            if (index != NULL)
                unlink(index);
            sqlite3_free(index);
            unlink(s->anchor_path);
            unlink(s->lock_path);
        }
#endif
        shm_free(s);
        p->shm = NULL;
    }
    p->shm_own = 0;
    return rc;
}
