/* Headers and data keys from Python (header_for), and new journals' made ahead in batches
 * (cdHeaderPool in cvfs.h). */
#include "cvfs.h"

#include <string.h>

unsigned long long n_header_batches;

static void pool_drop(cdHeaderPool *pool) {
    cd_wipe(pool->dek, sizeof pool->dek);
    pool->count = 0;
}

/* Take one entry for this geometry; 0 if there is none. Under the VFS's lock. */
static int pool_take(cdHeaderPool *pool, sqlite3_int64 seg, int lead, int extra, unsigned char *header,
                     unsigned char *dek, int *dek_len) {
    if (pool->generation != cd_generation() || pool->seg != seg || pool->lead != lead || pool->extra != extra)
        pool_drop(pool);
    if (pool->count == 0)
        return 0;
    int i = --pool->count;
    memcpy(header, pool->header[i], HEADER_SIZE);
    memcpy(dek, pool->dek[i], (size_t)pool->dek_len[i]);
    *dek_len = pool->dek_len[i];
    cd_wipe(pool->dek[i], MAX_DEK);
    return 1;
}

/* One (header, dek) tuple from header_for into out and dek; 1, or 0 with a TypeError set. */
static int take_pair(PyObject *pair, unsigned char *out, unsigned char *dek, int *dek_len) {
    char *h, *d;
    Py_ssize_t hl, dl;
    int ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 &&
             PyBytes_AsStringAndSize(PyTuple_GET_ITEM(pair, 0), &h, &hl) == 0 &&
             PyBytes_AsStringAndSize(PyTuple_GET_ITEM(pair, 1), &d, &dl) == 0 && hl == HEADER_SIZE &&
             dl <= MAX_DEK;
    if (ok) {
        memcpy(out, h, HEADER_SIZE);
        memcpy(dek, d, (size_t)dl);
        *dek_len = (int)dl;
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "header_for must return (header, dek) pairs");
    }
    return ok;
}

/* At most this many reads of one header: header_for stops asking for another well before
 * (cryptdisk.format.REREAD_DELAYS); this bounds the loop whatever it answers. */
#define MAX_HEADER_READS 64

/* One call of header_for (the GIL held): an existing file's header authenticated and its
 * data key (header given; attempt: the reads of it before this one), or a new file's; 1
 * with them in out and dek, 2 if an existing header is to be read again (header_for
 * answered None after its pause: a rewrap may have been writing it), or 0 with the Python
 * exception pending (WrongKeyError, ...). */
static int ask(cdFile *p, const unsigned char *header, sqlite3_int64 hlen, int attempt, sqlite3_int64 seg,
               int lead, int extra, unsigned char *out, unsigned char *dek, int *dek_len) {
    PyObject *r = header != NULL
                      ? PyObject_CallFunction(p->vfs->header_for, "sy#Liiii", p->path, (const char *)header,
                                              (Py_ssize_t)hlen, (long long)seg, 0, 0, 0, attempt)
                      : PyObject_CallFunction(p->vfs->header_for, "sOLii", p->path, Py_None, (long long)seg, lead,
                                              extra);
    if (r == Py_None && header != NULL) {
        Py_DECREF(r);
        if (attempt + 1 < MAX_HEADER_READS)
            return 2;
        PyErr_SetString(PyExc_RuntimeError, "header_for asked for a header to be read again too often");
        return 0;
    }
    int ok = r != NULL && take_pair(r, out, dek, dek_len);
    Py_XDECREF(r);
    return ok;
}

int cd_ask_header(cdFile *p, const unsigned char *header, sqlite3_int64 hlen, int attempt, sqlite3_int64 seg,
                  int lead, int extra, unsigned char *out, unsigned char *dek, int *dek_len) {
    PyGILState_STATE g = PyGILState_Ensure();
    /* an exception may already wait for apsw: a function of the statement raised, or an
     * earlier open failed, and SQLite opens (a rollback's journal) before returning */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int ok = ask(p, header, hlen, attempt, seg, lead, extra, out, dek, dek_len);
    cd_keep_earlier(et, ev, tb);
    PyGILState_Release(g);
    return ok == 1 ? SQLITE_OK : ok == 2 ? CD_REREAD : SQLITE_CANTOPEN;
}

/* HEADER_POOL new headers from one call of header_for(path, None, seg, lead, extra, count),
 * which returns a list of (header, dek): the interpreter is entered once per batch. */
static int pool_fill(cdFile *p, sqlite3_int64 seg, int lead, int extra) {
    cdHeaderPool fresh;
    int n = 0;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et, *ev, *tb; /* as in cd_ask_header */
    PyErr_Fetch(&et, &ev, &tb);
    n_header_batches++;
    PyObject *r = PyObject_CallFunction(p->vfs->header_for, "sOLiii", p->path, Py_None, (long long)seg, lead, extra,
                                        HEADER_POOL);
    if (r != NULL && PyList_Check(r) && PyList_GET_SIZE(r) == HEADER_POOL) {
        while (n < HEADER_POOL &&
               take_pair(PyList_GET_ITEM(r, n), fresh.header[n], fresh.dek[n], &fresh.dek_len[n]))
            n++;
        if (n < HEADER_POOL)
            n = 0; /* a malformed entry: use none of them */
    } else if (r != NULL) {
        PyErr_Format(PyExc_TypeError, "header_for must return a list of %d (header, dek) pairs", HEADER_POOL);
    }
    Py_XDECREF(r);
    cd_keep_earlier(et, ev, tb);
    PyGILState_Release(g);
    if (n == 0) {
        cd_wipe(fresh.dek, sizeof fresh.dek);
        return SQLITE_CANTOPEN; /* the exception stays pending: apsw raises it */
    }
    pthread_mutex_lock(&p->vfs->lock);
    cdHeaderPool *pool = &p->vfs->pool;
    pool_drop(pool);
    memcpy(pool->header, fresh.header, sizeof fresh.header);
    memcpy(pool->dek, fresh.dek, sizeof fresh.dek);
    memcpy(pool->dek_len, fresh.dek_len, sizeof fresh.dek_len);
    pool->count = n;
    pool->seg = seg;
    pool->lead = lead;
    pool->extra = extra;
    pool->generation = cd_generation();
    pthread_mutex_unlock(&p->vfs->lock);
    cd_wipe(fresh.dek, sizeof fresh.dek);
    return SQLITE_OK;
}

int cd_pooled_header(cdFile *p, sqlite3_int64 seg, int lead, int extra, unsigned char *header, unsigned char *dek,
                     int *dek_len) {
    for (int attempt = 0; attempt < 2; attempt++) {
        pthread_mutex_lock(&p->vfs->lock);
        int got = pool_take(&p->vfs->pool, seg, lead, extra, header, dek, dek_len);
        pthread_mutex_unlock(&p->vfs->lock);
        if (got)
            return SQLITE_OK;
        int rc = pool_fill(p, seg, lead, extra);
        if (rc != SQLITE_OK)
            return rc;
    }
    /* other threads took the whole batch meanwhile: ask for this one header alone */
    return cd_ask_header(p, NULL, 0, 0, seg, lead, extra, header, dek, dek_len);
}
