/* The VFS methods, the Python callbacks and module, and the SQLite entry point. */
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

const sqlite3_api_routines *sqlite3_api = NULL;

/* -- Python callbacks (with the GIL; apsw releases it around SQLite calls) -- */

/* msg (a char array) formatted from fmt and the variadic arguments after it */
#define CD_FORMAT(msg, fmt)                      \
    do {                                         \
        va_list ap_;                             \
        va_start(ap_, fmt);                      \
        vsnprintf(msg, sizeof msg, fmt, ap_);    \
        va_end(ap_);                             \
    } while (0)

/* After a call into Python made with the exception that was pending (et, ev, tb: taken
 * by PyErr_Fetch) set aside: that earlier exception is pending again, the call's own, if
 * any, dropped (apsw raises the first failure; SQLite has the call's return code). With
 * none earlier, the call's exception stays pending. */
void cd_keep_earlier(PyObject *et, PyObject *ev, PyObject *tb) {
    if (et == NULL)
        return;
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

void cd_warn(cdFile *p, const char *fmt, ...) {
    char msg[1024];
    CD_FORMAT(msg, fmt);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et, *ev, *tb; /* (a statement's exception may be pending) */
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallFunction(p->vfs->warner, "s", msg);
    if (r == NULL)
        PyErr_WriteUnraisable(p->vfs->warner);
    Py_XDECREF(r);
    PyErr_Restore(et, ev, tb);
    PyGILState_Release(g);
}

/* Leave a cryptdisk exception pending for apsw, which raises it to the caller of the statement. */
int cd_raise(cdFile *p, int code, sqlite3_int64 offset, const char *fmt, ...) {
    char msg[1024];
    CD_FORMAT(msg, fmt);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et, *ev, *tb; /* the file's failure replaces a pending exception (a statement's) */
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *exc = PyObject_CallFunction(p->vfs->raiser, "isLs", code, msg, (long long)offset, p->path);
    if (exc != NULL) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    } else {
        cd_keep_earlier(et, ev, tb);
    }
    PyGILState_Release(g);
    return SQLITE_CORRUPT;
}

/* A failed system call on a file of cryptdisk's own (the -cdtail side file): an OSError
 * (its errno's subclass: IsADirectoryError, PermissionError...) naming the file, left
 * pending for apsw unless an error already is; rc (an SQLITE_IOERR_* or SQLITE_FULL) for
 * SQLite. */
int cd_os_error(int rc, int err, const char *path) {
    PyGILState_STATE g = PyGILState_Ensure();
    if (!PyErr_Occurred()) {
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iss", err, strerror(err), path);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
    }
    PyGILState_Release(g);
    return rc;
}

int cd_auth_error(cdFile *p) {
    sqlite3_int64 where = rec_at(p, p->fail_index);
    return cd_raise(p, ERR_AUTH, where,
                    "%s: failed to decrypt and authenticate segment %lld at offset %lld", p->path,
                    (long long)p->fail_index, (long long)where);
}

/* -- vfs methods ------------------------------------------------------------- */

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A cdFile over the root VFS's file of name (which follows the cdFile in f), its path and
 * whether it is anonymous set; the io methods are the caller's to set. */
static int open_real(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    cdVfs *v = (cdVfs *)vfs;
    cdFile *p = (cdFile *)f;
    memset(p, 0, sizeof *p);
    p->real = (sqlite3_file *)&p[1];
    p->vfs = v;
    p->tail_fd = -1;
    p->anonymous = name == NULL;
    p->path = name ? name : "<temporary file>";
    return v->root->xOpen(v->root, name, p->real, flags, out_flags);
}

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    cdVfs *v = (cdVfs *)vfs;
    cdFile *p = (cdFile *)f;
    int rc = open_real(vfs, name, f, flags, out_flags);
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
        cd_list_add(&v->journals, p);
    }
    if (name != NULL && p->kind == KIND_MAIN) {
        p->barriers = 1;
        cd_list_add(&v->mains, p);
    }
    if (name != NULL && p->kind == KIND_WAL)
        p->wal_db_name = sqlite3_filename_database(name); /* matched by pointer, never read */
    if ((rc = cd_load(p)) != SQLITE_OK) {
        x_close(f);
        p->base.pMethods = NULL;
        return rc;
    }
    p->reused = p->loaded; /* a header before SQLite wrote: see x_device_characteristics */
    return SQLITE_OK;
}

/* The plain VFS (registered with header_for None): the default VFS's file, unencrypted,
 * with the wal-index of shm.c; the Python VFS's base. */
static int v_open_plain(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    cdFile *p = (cdFile *)f;
    int rc = open_real(vfs, name, f, flags, out_flags);
    if (rc != SQLITE_OK)
        return rc;
    p->kind = flags & SQLITE_OPEN_MAIN_DB ? KIND_MAIN : KIND_TEMP;
    p->base.pMethods = &cd_plain_io;
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
    int plain = header_for == Py_None;
    if (sqlite3_api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "load this module into SQLite first (sqlite3_cvfs_init)");
        return NULL;
    }
    if (strlen(name) >= sizeof v->name) {
        PyErr_SetString(PyExc_ValueError, "VFS name too long");
        return NULL;
    }
    if (cd_cipher_init() != SQLITE_OK) {
        PyErr_SetString(PyExc_RuntimeError, "the C VFS's cipher library could not be initialised "
                                            "(libgcrypt older than the headers it was built with?)");
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
    v->base.xOpen = plain ? v_open_plain : v_open;
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
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsK}", "sealed", n_seal, "sealed_bytes", n_seal_bytes, "opened",
                         n_unseal, "opened_bytes", n_unseal_bytes, "reused", n_reused, "tail_saves", n_tail_saves, "tail_syncs",
                         n_tail_syncs,
                         "size_queries", n_size_queries, "size_fstats", n_size_fstats, "header_batches",
                         n_header_batches);
}

static PyObject *py_cipher_library(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    cd_cipher_init();
    return PyUnicode_FromString(cd_cipher_library());
}

static PyMethodDef methods[] = {
    {"cipher_library", py_cipher_library, METH_NOARGS,
     "The library and version of the C VFS's AES-GCM, e.g. 'libgcrypt 1.10.1' (or 'OpenSSL 3.0.19 ...')."},
    {"stats", py_stats, METH_NOARGS,
     "Process-wide counts: records sealed and opened and their bytes, reads served from a kept "
     "plaintext without opening the record again, -cdtail copies (and syncs of them), "
     "raw size queries (and "
     "fstats among them), calls into Python for batches of journal headers."},
    {"ready", py_ready, METH_NOARGS, "True once SQLite has loaded this module as an extension."},
    {"register", py_register, METH_VARARGS,
     "register(name, header_for, raiser, warner): register an encrypting VFS with SQLite "
     "(header_for None: the default VFS's files unencrypted, with the wal-index off the disk)."},
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
