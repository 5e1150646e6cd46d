/* A stranger at an ofi listener, for tests/test_ofi_stranger.py: opens an
 * FI_EP_MSG endpoint of the provider FI_PROVIDER names and asks to connect to
 * HOST PORT with connection data that is not the job's token. Prints what
 * became of the request and exits 0 when it was refused, 1 when it got in,
 * 2 on any other failure. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <stdio.h>
#include <string.h>

static int fail(const char* what, int ret) {
  printf("%s: %s\n", what, fi_strerror(-ret));
  return 2;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  struct fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG | FI_RMA;
  hints->ep_attr->type = FI_EP_MSG;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  struct fi_info* info = NULL;
  int ret = fi_getinfo(FI_VERSION(1, 10), argv[1], argv[2], 0, hints, &info);
  if (ret) return fail("fi_getinfo", ret);
  struct fid_fabric* fabric = NULL;
  struct fid_domain* domain = NULL;
  struct fid_eq* eq = NULL;
  struct fid_cq* cq = NULL;
  struct fid_ep* ep = NULL;
  struct fi_eq_attr eq_attr = {.wait_obj = FI_WAIT_UNSPEC};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
  if ((ret = fi_fabric(info->fabric_attr, &fabric, NULL))) return fail("fi_fabric", ret);
  if ((ret = fi_eq_open(fabric, &eq_attr, &eq, NULL))) return fail("fi_eq_open", ret);
  if ((ret = fi_domain(fabric, info, &domain, NULL))) return fail("fi_domain", ret);
  if ((ret = fi_cq_open(domain, &cq_attr, &cq, NULL))) return fail("fi_cq_open", ret);
  if ((ret = fi_endpoint(domain, info, &ep, NULL))) return fail("fi_endpoint", ret);
  if ((ret = fi_ep_bind(ep, &eq->fid, 0))) return fail("fi_ep_bind eq", ret);
  if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV))) return fail("fi_ep_bind cq", ret);
  if ((ret = fi_enable(ep))) return fail("fi_enable", ret);
  const char guess[16] = "not the token!!";
  if ((ret = fi_connect(ep, info->dest_addr, guess, sizeof(guess)))) return fail("fi_connect", ret);
  unsigned char entry[sizeof(struct fi_eq_cm_entry) + 256];
  uint32_t event = 0;
  ssize_t n = fi_eq_sread(eq, &event, entry, sizeof(entry), 5000, 0);
  if (n == -FI_EAVAIL) {
    struct fi_eq_err_entry err;
    memset(&err, 0, sizeof(err));
    fi_eq_readerr(eq, &err, 0);
    printf("refused: %s\n", fi_strerror(err.err));
    return 0;
  }
  if (n < 0) return fail("fi_eq_sread", (int)n);
  if (event == FI_CONNECTED) {
    printf("connected\n");
    return 1;
  }
  printf("refused: event %u\n", event);
  return 0;
}
