/* Raw I/O through the default VFS's file, and the -cdtail side file (see _tail.py). */
#include "cvfs.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* -- raw I/O through the default VFS's file -------------------------------- */

unsigned long long n_size_queries, n_size_fstats;

/* The descriptor of the raw file: SQLite's unix VFS keeps it in its unixFile after three
 * pointers (pMethod, pVfs, pInode; the layout of every SQLite 3 release since 2010). Used
 * only when that file's pVfs is the root VFS and the descriptor is the file at p->path
 * (same device and inode); otherwise -1 and sizes come from xFileSize. */
static int raw_fd(cdFile *p) {
    if (p->raw_fd == 0) {
        struct { const void *methods; const sqlite3_vfs *vfs; const void *inode; int h; } *u = (void *)p->real;
        struct stat by_fd, by_path;
        p->raw_fd = -1;
        if (!p->anonymous && strncmp(p->vfs->root->zName, "unix", 4) == 0 && u->vfs == p->vfs->root &&
            u->h > 2 && fstat(u->h, &by_fd) == 0 && stat(p->path, &by_path) == 0 &&
            by_fd.st_dev == by_path.st_dev && by_fd.st_ino == by_path.st_ino)
            p->raw_fd = u->h;
    }
    return p->raw_fd;
}

/* The raw file's size. xFileSize is an fstat, and on Linux 6.13+ (multigrain timestamps)
 * any stat that reports ctime makes the file's next write take a fine-grained timestamp:
 * the inode is dirtied by every write that follows a stat, and each fdatasync then writes
 * the inode block too (one more block request and a wait per commit; docs/sqlite.md,
 * "Performance"). lseek(SEEK_END) reads the size without reporting times. */
int raw_size(cdFile *p, sqlite3_int64 *out) {
    int fd = raw_fd(p);
    n_size_queries++;
    if (fd > 0) {
        off_t end = lseek(fd, 0, SEEK_END);
        if (end >= 0) {
            *out = end == 1 ? 0 : (sqlite3_int64)end; /* as unixFileSize (its 1-byte workaround) */
            return SQLITE_OK;
        }
    }
    if (!p->anonymous)
        n_size_fstats++;
    return p->real->pMethods->xFileSize(p->real, out);
}

/* Read up to n raw bytes at where; *got is how many the file had. */
int raw_read(cdFile *p, unsigned char *buf, sqlite3_int64 n, sqlite3_int64 where, sqlite3_int64 *got) {
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

int raw_write(cdFile *p, const unsigned char *buf, sqlite3_int64 n, sqlite3_int64 where) {
    for (sqlite3_int64 pos = 0; pos < n; pos += RAW_CHUNK) {
        sqlite3_int64 k = n - pos < RAW_CHUNK ? n - pos : RAW_CHUNK;
        int rc = p->real->pMethods->xWrite(p->real, buf + pos, (int)k, where + pos);
        if (rc != SQLITE_OK)
            return rc;
    }
    return SQLITE_OK;
}

void pause_us(int us) {
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

unsigned long long get_u64le(const unsigned char *in) {
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++)
        v |= (unsigned long long)in[i] << (8 * i);
    return v;
}

/* fsync the directory holding path, so a file created there survives power loss. */
static void sync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash == NULL ? sqlite3_mprintf(".") : sqlite3_mprintf("%.*s", (int)(slash - path + 1), path);
    int fd;
    if (dir == NULL)
        return;
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    sqlite3_free(dir);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* index u64le || length u64le || record at offset 0 of the side file (opened the first
 * time); an error leaves an OSError naming the side file pending (cd_os_error). */
static int tail_write(cdFile *p, const unsigned char *head, const unsigned char *record, sqlite3_int64 len) {
    size_t done = 0, total = (size_t)(16 + len);
    if (p->tail_fd < 0) {
        p->tail_fd = open(p->tail_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (p->tail_fd < 0)
            return cd_os_error(errno == ENOSPC ? SQLITE_FULL : SQLITE_IOERR_WRITE, errno, p->tail_path);
    }
    while (done < total) { /* a short write is retried: the next one says why (ENOSPC, EFBIG) */
        struct iovec iov[2];
        int k = 0;
        size_t from = done < 16 ? 0 : done - 16;
        if (done < 16) {
            iov[k].iov_base = (void *)(head + done);
            iov[k++].iov_len = 16 - done;
        }
        iov[k].iov_base = (void *)(record + from);
        iov[k++].iov_len = (size_t)len - from;
        ssize_t n = pwritev(p->tail_fd, iov, k, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : ENOSPC;
            return cd_os_error(err == ENOSPC ? SQLITE_FULL : SQLITE_IOERR_WRITE, err, p->tail_path);
        }
        done += (size_t)n;
    }
    return SQLITE_OK;
}

/* Save the record of segment index before it is rewritten: index u64le || length u64le ||
 * record, one pwritev, then fdatasync. A killed process loses nothing once pwritev has
 * returned (the copy is in the page cache). Power loss is worse: the kernel may write the
 * rewrite back half done at any time, and the record holds bytes of commits SQLite synced
 * (or a checkpoint did), so the copy is synced before the rewrite is issued (with the
 * directory, the first time); and as the side file holds one record, the rewrite of the
 * one saved before is synced before its copy is replaced, unless SQLite synced the file
 * since (tail_pending). Written, not mapped: a mapped side file cut short by anyone (another
 * process, a user, a full file system under a sparse file) would kill the process with
 * SIGBUS at the next copy; a write that fails is an I/O error for SQLite (SQLITE_FULL when
 * the disk is full) and an OSError naming the side file for the caller. See docs/sqlite.md. */
int tail_save(cdFile *p, sqlite3_int64 index, const unsigned char *record, sqlite3_int64 len) {
    unsigned char head[16];
    int rc;
    n_tail_saves++;
    if (p->tail_pending) {
        if ((rc = p->real->pMethods->xSync(p->real, SQLITE_SYNC_NORMAL)) != SQLITE_OK)
            return rc;
        p->tail_pending = 0;
    }
    put_u64le(head, (unsigned long long)index);
    put_u64le(head + 8, (unsigned long long)len);
    if ((rc = tail_write(p, head, record, len)) != SQLITE_OK)
        return rc;
    n_tail_syncs++;
    if (fdatasync(p->tail_fd) != 0)
        return cd_os_error(SQLITE_IOERR_FSYNC, errno, p->tail_path);
    if (!p->tail_dir_synced) { /* errors ignored, as SQLite's unixSync ignores them for directories */
        sync_dir_of(p->tail_path);
        p->tail_dir_synced = 1;
    }
    p->tail_pending = 1;
    return SQLITE_OK;
}

/* The saved record of segment index into into (up to one record); its length, or 0. */
sqlite3_int64 tail_load(cdFile *p, sqlite3_int64 index, unsigned char *into) {
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
