#ifndef STITCH_CSQLITE_SHIM_H
#define STITCH_CSQLITE_SHIM_H
#include <sqlite3.h>

/* SQLITE_TRANSIENT is a cast of -1 to a function pointer, which Swift cannot import; bind text through this. */
static inline int stitch_sqlite3_bind_text_transient(sqlite3_stmt *statement, int index, const char *text) {
    return sqlite3_bind_text(statement, index, text, -1, SQLITE_TRANSIENT);
}
static inline int stitch_sqlite3_bind_blob_transient(sqlite3_stmt *statement, int index, const void *bytes, int count) {
    return sqlite3_bind_blob(statement, index, bytes, count, SQLITE_TRANSIENT);
}
/* Text with an explicit byte count (so it may hold NUL); a NULL pointer (Swift's empty buffer) binds '' rather than
 * SQL NULL. */
static inline int stitch_sqlite3_bind_text_count_transient(
    sqlite3_stmt *statement, int index, const char *text, int count
) {
    return sqlite3_bind_text(statement, index, text != 0 ? text : "", text != 0 ? count : 0, SQLITE_TRANSIENT);
}
/* Extended result codes are macros built from other macros, which Swift does not import. */
static const int stitch_sqlite_constraint_primarykey = SQLITE_CONSTRAINT_PRIMARYKEY;
#endif
