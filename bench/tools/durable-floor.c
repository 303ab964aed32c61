/* The floor of writing N files durably, as stitch must before each appears (rule 1): per file, create NAME.part,
 * write SIZE bytes, fsync it, rename it into place, fsync the folder; THREADS at once (as `stitch get -i -j`).
 * No network, no bookkeeping: what the file system alone costs. bench/batch.sh runs it as the `floor` reference.
 *
 *   durable-floor DIR FILES SIZE_BYTES THREADS [nosync]
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dir;
static int files, threads, nosync;
static size_t size;
static atomic_int next;
static char *buffer;

static void *worker(void *unused) {
    (void)unused;
    char part[4096], name[4096];
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dirfd < 0) { perror("open dir"); exit(1); }
    for (;;) {
        int i = atomic_fetch_add(&next, 1);
        if (i >= files) break;
        snprintf(part, sizeof part, "%s/f%d.bin.part", dir, i + 1);
        snprintf(name, sizeof name, "%s/f%d.bin", dir, i + 1);
        int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) { perror("open"); exit(1); }
        for (size_t done = 0; done < size;) {
            size_t chunk = size - done < 16384 ? size - done : 16384;
            ssize_t n = write(fd, buffer + done, chunk);
            if (n <= 0) { perror("write"); exit(1); }
            done += (size_t)n;
        }
        if (!nosync && fsync(fd) != 0) { perror("fsync"); exit(1); }
        close(fd);
        if (rename(part, name) != 0) { perror("rename"); exit(1); }
        if (!nosync && fsync(dirfd) != 0) { perror("fsync dir"); exit(1); }
    }
    close(dirfd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: durable-floor DIR FILES SIZE_BYTES THREADS [nosync]\n"); return 64; }
    dir = argv[1];
    files = atoi(argv[2]);
    size = (size_t)atol(argv[3]);
    threads = atoi(argv[4]);
    nosync = argc > 5 && strcmp(argv[5], "nosync") == 0;
    buffer = malloc(size);
    for (size_t i = 0; i < size; i++) buffer[i] = (char)(i * 131 + 7);
    pthread_t tids[256];
    if (threads < 1 || threads > 256) return 64;
    for (int t = 0; t < threads; t++) pthread_create(&tids[t], NULL, worker, NULL);
    for (int t = 0; t < threads; t++) pthread_join(tids[t], NULL);
    return 0;
}
