/* A fault harness for router/udp/_send_ring.h, compiled and run by tests/udp/test_udp_send_ring.py.
 *
 * The ring's io_uring_enter goes through a stand-in (SEND_RING_ENTER) that lets the kernel take and
 * run every queued sendmsg, hides their completions, then fails the wait for them with EBADF, as a
 * real io_uring_enter may fail (EINTR aside) when it returned before all of them completed. The harness then does what
 * the C splice does with each entry's result (_splice.c, after_ring_failure): sends again the messages the ring reports
 * as never sent (send_ring_untried). It prints the datagrams the receiver got and how many were
 * queued: equal when nothing the kernel took is sent twice. Exit 77: no io_uring here.
 *
 * usage: send_ring_faults MESSAGES
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static long fault_enter(int fd, unsigned submit, unsigned wait, unsigned flags);
#define SEND_RING_ENTER(fd, submit, wait, flags) fault_enter(fd, submit, wait, flags)
#include "_send_ring.h"

static SendRing ring;
static unsigned frozen_tail; /* what the hidden completion queue's tail reads */

static long
fault_enter(int fd, unsigned submit, unsigned wait, unsigned flags)
{
    if (submit == 0) { /* the wait for the completions not seen yet: it fails */
        errno = EBADF;
        return -1;
    }
    long taken = syscall(__NR_io_uring_enter, fd, submit, wait, flags, NULL, 0); /* the sends run */
    frozen_tail = *ring.cq_head;
    ring.cq_tail = &frozen_tail; /* but their completions are not seen */
    return taken;
}

int
main(int argc, char **argv)
{
    int messages = argc > 1 ? atoi(argv[1]) : 3;
    if (messages < 1 || messages > 64)
        return 2;
    if (send_ring_open(&ring) < 0) {
        printf("no io_uring: %s\n", strerror(errno));
        return 77;
    }
    int receiver = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int sender = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t to_len = sizeof to;
    if (receiver < 0 || sender < 0 || bind(receiver, (struct sockaddr *)&to, sizeof to) < 0 ||
        getsockname(receiver, (struct sockaddr *)&to, &to_len) < 0 ||
        connect(sender, (struct sockaddr *)&to, sizeof to) < 0) {
        perror("sockets");
        return 2;
    }
    char payload[64][8];
    struct iovec iov[64];
    struct msghdr msg[64];
    int results[64];
    for (int i = 0; i < messages; i++) {
        snprintf(payload[i], sizeof payload[i], "m%d", i);
        iov[i] = (struct iovec){ payload[i], strlen(payload[i]) };
        msg[i] = (struct msghdr){ .msg_iov = &iov[i], .msg_iovlen = 1 };
        send_ring_queue(&ring, sender, &msg[i], (unsigned)i, i + 1 < messages);
    }
    int broken = send_ring_run(&ring, results) < 0;
    for (int i = 0; i < messages; i++)
        if (send_ring_untried(results[i]) && sendmsg(sender, &msg[i], 0) < 0)
            perror("sendmsg");
    int received = 0;
    char buffer[64];
    while (recv(receiver, buffer, sizeof buffer, 0) >= 0)
        received++;
    printf("queued %d received %d broken %d\n", messages, received, broken);
    return 0;
}
